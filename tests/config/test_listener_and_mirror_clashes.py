"""Listener addresses that the daemon could never bind together are refused when the file
is read, naming the key, whether the address was written or is a default."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import load_config
from tests.config.helpers import UUID1, config_text, expect_error, load, write


@pytest.mark.parametrize(
    ("endpoint", "rest", "taken"),
    [
        ("", "[client]\nport = 8022\n", "client.port"),
        ("port = 8022\n", "", "endpoint.port"),
        ('host = "localhost"\nport = 8022\n', "", "endpoint.port"),
    ],
)
def test_the_default_admin_address_may_not_be_another_listeners(
    tmp_path: Path, endpoint: str, rest: str, taken: str
) -> None:
    """[admin] listen unset on a loopback endpoint means port 8022 of its host: a file whose
    client listener or endpoint already has that address cannot run."""
    err = expect_error(tmp_path, config_text(endpoint, rest), "admin.listen", f"{taken}'s address")
    assert '"off"' in err.problem


def test_the_default_admin_address_is_kept_when_it_is_free(tmp_path: Path) -> None:
    assert load(tmp_path, rest="[client]\nport = 8023\n").admin.port == 8022
    off = load(tmp_path, rest='[client]\nport = 8022\n[admin]\nlisten = "off"\n').admin
    assert not off.enabled
    moved = load(tmp_path, rest='[client]\nport = 8022\n[admin]\nlisten = "127.0.0.1:8030"\n')
    assert (moved.admin.host, moved.admin.port) == ("127.0.0.1", 8030)


@pytest.mark.parametrize(
    ("endpoint", "client"),
    [
        ("", 'host = "localhost"\nport = 4022\n'),
        ('host = "localhost"\n', 'host = "127.0.0.1"\nport = 4022\n'),
        ('host = "::1"\n', 'host = "localhost"\nport = 4022\n'),
        ('host = "::1"\n', 'host = "0:0:0:0:0:0:0:1"\nport = 4022\n'),
    ],
)
def test_a_client_listener_on_the_endpoints_address_in_another_spelling_is_refused(
    tmp_path: Path, endpoint: str, client: str
) -> None:
    """``localhost`` is 127.0.0.1 (and ::1), an IPv6 address has several spellings: the
    client listener on the endpoint's port of the same host cannot start."""
    text = config_text(endpoint, f'[client]\n{client}[admin]\nlisten = "off"\n')
    expect_error(tmp_path, text, "client.port", "also endpoint.port on the same host")


def mirrored(settings: str, endpoint: str = 'host = "127.0.0.5"\n') -> str:
    """A file whose database ``parts`` is mirrored (R-ROUTE-10, R-ROUTE-16) with
    ``settings``."""
    database = f'[[database]]\nname = "parts"\nbroker_instance = "{UUID1}"\n{settings}'
    return config_text(endpoint, database)


@pytest.mark.parametrize("setting", ['mirror_when_lost = "stall"\n', "mirror_timeout = 2.0\n"])
def test_mirror_settings_without_a_partner_are_refused(tmp_path: Path, setting: str) -> None:
    """R-ROUTE-16: what a principal does when its mirror is lost applies only to a database
    whose commits are shipped to a partner. Without ``mirror_partner`` nothing is shipped:
    ``stall`` would be ignored and every commit released at once, unprotected."""
    key = setting.split(" ")[0]
    expect_error(tmp_path, mirrored(setting), f"database[0].{key}", "mirror_partner")
    expect_error(
        tmp_path,
        mirrored('mirror_role = "principal"\n' + setting),
        f"database[0].{key}",
        "mirror_partner",
    )
    partner = 'mirror_role = "principal"\nmirror_partner = "tcp://127.0.0.6:4022"\n'
    cfg = load_config(write(tmp_path, mirrored(partner + setting)))
    assert cfg.database("parts").mirror_partner == "tcp://127.0.0.6:4022"


@pytest.mark.parametrize(
    ("endpoint", "partner"),
    [
        ('host = "127.0.0.5"\n', "tcp://127.0.0.5:4022"),
        ('host = "127.0.0.5"\nport = 4100\n', "tcp://127.0.0.5:4100/"),
        ('host = "localhost"\n', "tcp://127.0.0.1:4022"),
        ('host = "0.0.0.0"\n', "tcp://localhost:4022"),
    ],
)
def test_a_mirror_partner_that_is_this_instance_is_refused(
    tmp_path: Path, endpoint: str, partner: str
) -> None:
    """R-ROUTE-16: the partner is the other instance of the pair. A partner address that is
    this instance's own endpoint (a file copied from the partner's, half edited) leaves
    the principal waiting for a mirror that never attaches."""
    settings = f'mirror_role = "mirror"\nmirror_partner = "{partner}"\n'
    text = mirrored(settings, endpoint)
    expect_error(tmp_path, text, "database[0].mirror_partner", "this instance's own endpoint")
    elsewhere = settings.replace(partner, "tcp://10.1.2.3:4022")
    assert load_config(write(tmp_path, mirrored(elsewhere, endpoint))).database("parts")
