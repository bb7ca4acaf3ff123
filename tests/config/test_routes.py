"""Routes, client listeners and dialog security in the TOML configuration (brokerd/config/;
SPEC R-OBJ-1..7, R-DLG-14), each bad value refused with the key that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import (
    ClientToken,
    parse_config,
)
from brokerd.errors import ConfigError
from protocol.frames import MAX_NAME_BYTES
from tests.config.helpers import (
    LONG,
    config_text,
    db,
    expect_error,
    load,
)

UUID2 = "1d4e2b3c-5a6f-4b7c-8d9e-0f1a2b3c4d5e"

# ---------------------------------------------------------------------------- errors: routes


def route(body: str) -> str:
    return db('[[database.route]]\nname = "r"\n' + body)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (db('[[database.route]]\naddress = "LOCAL"\n'), "database[0].route[0].name", "is required"),
        (route(""), "database[0].route[0].address", "is required"),
        (route("address = 4022\n"), "database[0].route[0].address", "must be a string"),
        (
            route('address = "localhost"\n'),
            "database[0].route[0].address",
            "LOCAL, TRANSPORT or tcp://host:port",
        ),
        (route('address = "tcp://h"\n'), "database[0].route[0].address", "has no port"),
        (route('address = "tcp://:4022"\n'), "database[0].route[0].address", "has no host"),
        (
            route('address = "tcp://h:0"\n'),
            "database[0].route[0].address",
            "not between 1 and 65535",
        ),
        (
            route('address = "tcp://h:70000"\n'),
            "database[0].route[0].address",
            "not between 1 and 65535",
        ),
        (route('address = "tcp://h:x"\n'), "database[0].route[0].address", "is not a number"),
        (
            route('address = "LOCAL"\nmirror_address = "tcp://h:1"\n'),
            "database[0].route[0].mirror_address",
            "only allowed with a tcp:// address, not with LOCAL",
        ),
        (
            route('address = "transport"\nmirror_address = "tcp://h:1"\n'),
            "database[0].route[0].mirror_address",
            "not with TRANSPORT",
        ),
        (
            route('address = "tcp://h:1"\nmirror_address = "LOCAL"\n'),
            "database[0].route[0].mirror_address",
            "must be tcp://host:port",
        ),
        (
            route('address = "tcp://h:1"\nmirror_address = "TCP://h:01"\n'),
            "database[0].route[0].mirror_address",
            "must differ from address",
        ),
        (
            route('address = "LOCAL"\nbroker_instance = "xyz"\n'),
            "database[0].route[0].broker_instance",
            "'xyz' is not a UUID",
        ),
        (
            route('address = "LOCAL"\nremote_service_name = ""\n'),
            "database[0].route[0].remote_service_name",
            "must not be empty",
        ),
        (
            route(f'address = "LOCAL"\nremote_service_name = "{LONG}"\n'),
            "database[0].route[0].remote_service_name",
            f"at most {MAX_NAME_BYTES}",
        ),
        (
            route('address = "LOCAL"\n[[database.route]]\nname = "R"\naddress = "TRANSPORT"\n'),
            "database[0].route[1].name",
            "route 'R' is already defined in database 'shop' at database[0].route[0]",
        ),
        (
            route('address = "LOCAL"\nlifetime = 0\n'),
            "database[0].route[0].lifetime",
            "positive number of seconds",
        ),
        (route('address = "LOCAL"\nlifetime = -5\n'), "database[0].route[0].lifetime", "positive"),
        (route('address = "LOCAL"\nlifetime = nan\n'), "database[0].route[0].lifetime", "positive"),
        (
            route('address = "LOCAL"\nlifetime = true\n'),
            "database[0].route[0].lifetime",
            "not the boolean true",
        ),
        (
            route('address = "LOCAL"\nlifetime = "3600"\n'),
            "database[0].route[0].lifetime",
            "not the string",
        ),
        (
            route('address = "LOCAL"\nlifetime = 2030-01-01T00:00:00\n'),
            "database[0].route[0].lifetime",
            "needs a time zone offset",
        ),
        (
            route('address = "LOCAL"\nlifetime = 2030-01-01\n'),
            "database[0].route[0].lifetime",
            "not a date",
        ),
        (
            route('address = "LOCAL"\nlifetime = 12:00:00\n'),
            "database[0].route[0].lifetime",
            "not a time",
        ),
        (
            route('address = "LOCAL"\nlifetime = 9223372036854775807\n'),
            "database[0].route[0].lifetime",
            "too far in the future",
        ),
    ],
)
def test_routes_are_validated(tmp_path: Path, text: str, key: str, problem: str) -> None:
    expect_error(tmp_path, text, key, problem)


@pytest.mark.parametrize(
    "body",
    [
        'address = "TRANSPORT"\n',
        'address = "tcp://h:1"\n',
        'address = "LOCAL"\nremote_service_name = "//s"\n',
        f'address = "LOCAL"\nbroker_instance = "{UUID2}"\n',
        'address = "LOCAL"\nlifetime = 60\n',
    ],
)
def test_auto_created_local_is_reserved_unless_restated_exactly(tmp_path: Path, body: str) -> None:
    """R-OBJ-6: the store creates AutoCreatedLocal = (NULL, NULL, LOCAL, NULL)."""
    text = db('[[database.route]]\nname = "AutoCreatedLocal"\n' + body)
    expect_error(tmp_path, text, "database[0].route[0].name", "created by the store")


def test_auto_created_local_in_another_case_is_refused(tmp_path: Path) -> None:
    text = db('[[database.route]]\nname = "autocreatedlocal"\naddress = "LOCAL"\n')
    expect_error(tmp_path, text, "database[0].route[0].name", "AutoCreatedLocal")


def test_parse_config_without_a_file(tmp_path: Path) -> None:
    """parse_config never reads ``path``; it only names it and anchors relative paths."""
    path = tmp_path / "sub" / "never-written.toml"
    cfg = parse_config(config_text(), path)
    assert cfg.data_dir == tmp_path / "sub" / "data"
    with pytest.raises(ConfigError) as info:
        parse_config(config_text(endpoint="port = 0"), path)
    assert str(info.value).startswith(f"{path}: endpoint.port: ")


def test_a_remote_client_listener_needs_tls(tmp_path: Path) -> None:
    """A client listener that is not on loopback speaks TLS; loopback may, too."""
    tls = 'tls_certificate = "alpha.pem"\ntls_private_key = "alpha.key"\n'
    cfg = load(tmp_path, rest=f'[client]\nhost = "0.0.0.0"\n{tls}')
    assert (cfg.client.host, cfg.client.tls) == ("0.0.0.0", True)
    assert cfg.client.tls_certificate == tmp_path / "alpha.pem"
    local = load(tmp_path, rest='[client]\nhost = "localhost"\n')
    assert (local.client.host, local.client.tls) == ("localhost", False)
    assert load(tmp_path, rest=f"[client]\n{tls}").client.tls


def test_client_tokens_name_a_file_a_role_and_what_an_application_owns(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        rest="""[client]
[[client.token]]
name = "shop"
file = "tokens/shop.token"
role = "application"
services = ["//shop/Client"]
queues = ["ClientQueue"]
[[client.token]]
name = "ops"
file = "/etc/brokerd/ops.token"
role = "ADMIN"
""",
    )
    shop, ops = cfg.client.tokens
    assert shop == ClientToken(
        "shop",
        tmp_path / "tokens/shop.token",
        "application",
        ("//shop/Client",),
        ("ClientQueue",),
    )
    assert (ops.name, ops.file, ops.role) == ("ops", Path("/etc/brokerd/ops.token"), "admin")
    assert cfg.client.token_file == tmp_path / "data" / "client.token"


# ------------------------------------------------------------------ dialog security (R-DLG-14)

_SECURED_DB = """[[database]]
name = "shop"
[[database.queue]]
name = "Q"
[[database.service]]
name = "//shop/Client"
queue = "Q"
{service}
[[database.remote_service_binding]]
service = "//warehouse/Orders"
certificate = "certs/warehouse.pem"
"""


def test_service_key_pairs_and_remote_service_bindings(tmp_path: Path) -> None:
    service = (
        'certificate = "certs/shop.pem"\nprivate_key = "certs/shop.key"\n'
        'dialog_security = "Required"'
    )
    (db,) = [
        d
        for d in load(tmp_path, rest=_SECURED_DB.format(service=service)).databases
        if d.name == "shop"
    ]
    (svc,) = db.services
    assert (svc.certificate, svc.private_key, svc.dialog_security) == (
        tmp_path / "certs/shop.pem",
        tmp_path / "certs/shop.key",
        True,
    )
    (binding,) = db.remote_service_bindings
    assert (binding.service, binding.certificate) == (
        "//warehouse/Orders",
        tmp_path / "certs/warehouse.pem",
    )


@pytest.mark.parametrize(
    ("service", "key", "problem"),
    [
        ('certificate = "a.pem"', "database[0].service[0].private_key", "is required with"),
        ('dialog_security = "required"', "database[0].service[0].dialog_security", "needs its"),
        ('dialog_security = "maybe"', "database[0].service[0].dialog_security", "one of off"),
    ],
)
def test_dialog_security_settings_are_checked(
    tmp_path: Path, service: str, key: str, problem: str
) -> None:
    expect_error(tmp_path, config_text(rest=_SECURED_DB.format(service=service)), key, problem)


def test_a_remote_service_binding_is_given_once(tmp_path: Path) -> None:
    twice = _SECURED_DB.format(service="") + (
        '[[database.remote_service_binding]]\nservice = "//warehouse/Orders"\n'
        'certificate = "other.pem"\n'
    )
    expect_error(
        tmp_path,
        config_text(rest=twice),
        "database[0].remote_service_binding[1].service",
        "already bound",
    )
