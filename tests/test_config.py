"""The daemon's TOML configuration (brokerd/config/; SPEC R-OBJ-1..7), read from real files."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from brokerd.config import (
    SENT_BY,
    VALIDATIONS,
    BrokerConfig,
    ClientToken,
    ContractConfig,
    ContractMessage,
    DatabaseConfig,
    LimitsConfig,
    MessageTypeConfig,
    PoisonHandling,
    PoisonPolicy,
    QueueConfig,
    RetryConfig,
    RouteConfig,
    ServiceConfig,
    load_config,
    parse_config,
    parse_tcp_address,
)
from brokerd.errors import ConfigError
from protocol.frames import DEFAULT_MAX_FRAME_SIZE, MAX_NAME_BYTES

EXAMPLES = Path(__file__).resolve().parent.parent / "config"
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
UUID1 = "8c2f4a1e-0b7d-4c3a-9e55-0a1f0e3b7c11"
UUID2 = "1d4e2b3c-5a6f-4b7c-8d9e-0f1a2b3c4d5e"

ENDPOINT = """\
[endpoint]
certificate = "certs/a.pem"
private_key = "certs/a.key"
ca_certificate = "certs/ca.pem"
"""

SHOP = """\
[[database]]
name = "shop"
[[database.message_type]]
name = "//shop/Request"
validation = "well_formed_xml"
[[database.contract]]
name = "//shop/Contract"
messages = [{ message_type = "//shop/Request", sent_by = "initiator" }]
[[database.queue]]
name = "ShopQueue"
[[database.service]]
name = "//shop/Orders"
queue = "ShopQueue"
contracts = ["//shop/Contract"]
"""


def config_text(endpoint: str = "", rest: str = "", data_dir: str = 'data_dir = "data"\n') -> str:
    """A minimal valid file; ``endpoint`` lines go into [endpoint], ``rest`` after it."""
    return data_dir + ENDPOINT + endpoint + "\n" + rest


def write(tmp_path: Path, text: str, name: str = "broker.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, endpoint: str = "", rest: str = "") -> BrokerConfig:
    return load_config(write(tmp_path, config_text(endpoint, rest)))


def expect_error(tmp_path: Path, text: str, key: str, problem: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    message = str(err)
    assert str(path) in message
    assert err.key == key, message
    assert key in message
    assert problem in message, message
    return err


# ---------------------------------------------------------------------------- examples


def test_example_alpha_loads() -> None:
    cfg = load_config(EXAMPLES / "example-alpha.toml")
    assert cfg.endpoint.host == "127.0.0.1"
    assert cfg.endpoint.port == 4022
    assert cfg.data_dir == EXAMPLES / "data" / "alpha"
    assert cfg.endpoint.certificate == EXAMPLES / "certs" / "alpha.pem"
    assert cfg.endpoint.private_key == EXAMPLES / "certs" / "alpha.key"
    assert cfg.endpoint.ca_certificate == EXAMPLES / "certs" / "ca.pem"
    shop = cfg.database("shop")
    assert shop.services == (ServiceConfig("//shop/Client", "ClientQueue", ()),)
    assert shop.contracts == (
        ContractConfig(
            "//shop/OrderContract",
            (
                ContractMessage("//shop/Order", "initiator"),
                ContractMessage("//shop/Confirmation", "target"),
            ),
        ),
    )
    assert {m.validation for m in shop.message_types} == {"none"}
    assert shop.routes == (
        RouteConfig(
            "ToWarehouse", "tcp://127.0.0.2:4022", remote_service_name="//warehouse/Orders"
        ),
    )
    assert cfg.database("msdb") == DatabaseConfig(name="msdb")


def test_example_beta_loads_and_matches_alpha() -> None:
    alpha = load_config(EXAMPLES / "example-alpha.toml")
    beta = load_config(EXAMPLES / "example-beta.toml")
    assert beta.endpoint.host == "127.0.0.2"
    assert beta.data_dir == EXAMPLES / "data" / "beta"
    warehouse = beta.database("warehouse")
    assert warehouse.services == (
        ServiceConfig("//warehouse/Orders", "OrderQueue", ("//shop/OrderContract",)),
    )
    assert warehouse.routes == (
        RouteConfig("ToShop", "tcp://127.0.0.1:4022", remote_service_name="//shop/Client"),
    )
    # Both sides agree on the contract and its message types (compared byte for byte).
    assert warehouse.contracts == alpha.database("shop").contracts
    assert warehouse.message_types == alpha.database("shop").message_types
    # Each route points at the other's endpoint.
    assert (
        alpha.database("shop")
        .routes[0]
        .address.endswith(f"{beta.endpoint.host}:{beta.endpoint.port}")
    )
    assert warehouse.routes[0].address.endswith(f"{alpha.endpoint.host}:{alpha.endpoint.port}")
    assert (alpha.client.host, beta.client.host) == ("127.0.0.1", "127.0.0.2")


# ---------------------------------------------------------------------------- defaults


def test_minimal_file_gets_every_default(tmp_path: Path) -> None:
    path = write(tmp_path, config_text())
    cfg = load_config(path)
    assert cfg.path == path
    assert cfg.data_dir == tmp_path / "data"
    e = cfg.endpoint
    assert (e.host, e.port, e.encryption) == ("127.0.0.1", 4022, "required")
    assert (e.message_forwarding, e.message_forward_size) == (False, 10)
    assert e.max_frame_size == DEFAULT_MAX_FRAME_SIZE
    assert e.fragments_per_frame == 4096
    assert (e.idle_timeout, e.connect_timeout) == (90.0, 5.0)
    assert (e.reconnect_initial, e.reconnect_max) == (1.0, 2.0)
    assert (e.heartbeat_interval, e.heartbeat_deadline) == (5.0, 20.0)
    assert cfg.retry == RetryConfig(
        initial=4.0, maximum=64.0, ack_delay=0.02, delayed_retry=5.0, redial_after=4
    )
    assert cfg.limits == LimitsConfig(max_message_size=100 * 1024 * 1024, fragment_size=65536)
    assert cfg.client.host == "127.0.0.1"
    assert cfg.client.port == 4023
    assert cfg.client.token_file == tmp_path / "data" / "client.token"
    assert cfg.databases == (DatabaseConfig(name="msdb"),)


def test_object_defaults(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        rest="""
[[database]]
name = "db"
[[database.message_type]]
name = "m"
[[database.queue]]
name = "q"
[[database.service]]
name = "s"
queue = "q"
[[database.route]]
name = "r"
address = "TRANSPORT"
""",
    )
    db = cfg.database("db")
    assert db.broker_instance is None
    assert db.message_types == (MessageTypeConfig("m", "none"),)
    assert db.queues == (QueueConfig("q", status=True, retention=False),)
    assert db.services == (ServiceConfig("s", "q", ()),)
    assert db.routes == (RouteConfig("r", "TRANSPORT"),)
    assert [d.name for d in cfg.databases] == ["db", "msdb"]


def test_full_file_round_trip(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        endpoint="""
host = "0.0.0.0"
port = 5022
encryption = "Supported"
message_forwarding = true
message_forward_size = 0
max_frame_size = 65536
idle_timeout = 10
connect_timeout = 2.5
reconnect_initial = 0.5
reconnect_max = 0.5
heartbeat_interval = 0.25
heartbeat_deadline = 1
""",
        rest=f"""
[retry]
initial = 1
maximum = 1
ack_delay = 0.5
delayed_retry = 2
redial_after = 2
[client]
host = "::1"
port = 6000
token_file = "/run/brokerd/token"
[limits]
max_message_size = 1
fragment_size = 1024
page_cache_mb = 8
body_segment_mb = 16
body_compact_after = 2.5
send_window = 500
backlog_send_window = 600
send_window_mb = 4
[[database]]
name = "shop"
broker_instance = "{UUID1.upper()}"
[[database.queue]]
name = "Q1"
status = "OFF"
retention = true
[[database.queue]]
name = "Q2"
status = false
poison_message_handling = "DISABLE"
poison_rollbacks = 7
""",
    )
    e = cfg.endpoint
    assert (e.host, e.port, e.encryption) == ("0.0.0.0", 5022, "supported")
    assert (e.message_forwarding, e.message_forward_size, e.max_frame_size) == (True, 0, 65536)
    assert (e.idle_timeout, e.connect_timeout, e.reconnect_initial, e.reconnect_max) == (
        10.0,
        2.5,
        0.5,
        0.5,
    )
    assert isinstance(e.idle_timeout, float)
    assert (e.heartbeat_interval, e.heartbeat_deadline) == (0.25, 1.0)
    assert cfg.retry == RetryConfig(1.0, 1.0, 0.5, 2.0, redial_after=2)
    assert (cfg.client.host, cfg.client.port) == ("::1", 6000)
    assert cfg.client.token_file == Path("/run/brokerd/token")
    assert cfg.limits == LimitsConfig(
        1,
        1024,
        page_cache_mb=8,
        body_segment_mb=16,
        body_compact_after=2.5,
        send_window=500,
        backlog_send_window=600,
        send_window_mb=4,
    )
    shop = cfg.database("shop")
    assert shop.broker_instance == uuid.UUID(UUID1)
    disable = PoisonPolicy(PoisonHandling.DISABLE, 7)
    assert shop.queues == (
        QueueConfig("Q1", False, True),  # quarantine after 5 rollbacks, the default (SPEC §6)
        QueueConfig("Q2", False, False, disable),
    )
    assert shop.queues[0].poison == PoisonPolicy(PoisonHandling.QUARANTINE, 5)


def test_client_host_follows_a_loopback_endpoint_only(tmp_path: Path) -> None:
    assert load(tmp_path, endpoint='host = "127.0.0.5"').client.host == "127.0.0.5"
    assert load(tmp_path, endpoint='host = "::1"').client.host == "::1"
    assert load(tmp_path, endpoint='host = "10.1.2.3"').client.host == "127.0.0.1"
    assert load(tmp_path, endpoint='host = "broker.example"').client.host == "127.0.0.1"


def test_admin_port_is_on_by_default_on_loopback_only(tmp_path: Path) -> None:
    """[admin] listen: the endpoint's loopback host, port 8022, unless told; off on any
    other address unless asked; "off" turns it off."""
    on = load(tmp_path, endpoint='host = "127.0.0.5"').admin
    assert (on.host, on.port, on.url) == ("127.0.0.5", 8022, "http://127.0.0.5:8022")
    assert not load(tmp_path, endpoint='host = "10.1.2.3"').admin.enabled
    assert load(tmp_path, endpoint='host = "10.1.2.3"', rest='[admin]\nlisten = "0.0.0.0:9100"\n')
    assert not load(tmp_path, rest='[admin]\nlisten = "off"\n').admin.enabled
    v6 = load(tmp_path, rest='[admin]\nlisten = "[::1]:8080"\n').admin
    assert (v6.host, v6.port, v6.url) == ("::1", 8080, "http://[::1]:8080")


@pytest.mark.parametrize(
    ("listen", "problem"),
    [
        ('"127.0.0.1"', "has no port"),
        ('"127.0.0.1:http"', "is not a number"),
        ('"127.0.0.1:70000"', "is not between 1 and 65535"),
        ('"/admin:80"', "is not a host name or address"),
        ("8022", "must be a string"),
        ('"127.0.0.1:4023"', "client.port's address"),
    ],
)
def test_a_bad_admin_listen_is_a_clear_error(tmp_path: Path, listen: str, problem: str) -> None:
    expect_error(
        tmp_path, config_text(rest=f"[admin]\nlisten = {listen}\n"), "admin.listen", problem
    )


def test_fragment_size_default_shrinks_to_fit_a_small_frame(tmp_path: Path) -> None:
    cfg = load(tmp_path, endpoint="max_frame_size = 32768")
    assert cfg.limits.fragment_size == 32768 - 8192


def test_msdb_may_be_configured_and_is_not_added_twice(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        rest="""
[[database]]
name = "msdb"
[[database.route]]
name = "Forward"
address = "tcp://10.0.0.9:4022"
""",
    )
    assert [d.name for d in cfg.databases] == ["msdb"]
    assert cfg.database("msdb").routes == (RouteConfig("Forward", "tcp://10.0.0.9:4022"),)


def test_database_lookup_raises_key_error(tmp_path: Path) -> None:
    cfg = load(tmp_path, rest=SHOP)
    assert cfg.database("shop").services[0].contracts == ("//shop/Contract",)
    with pytest.raises(KeyError):
        cfg.database("SHOP")
    with pytest.raises(KeyError):
        cfg.database("nope")


def test_implicit_defaults_are_usable_but_not_listed(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        rest="""
[[database]]
name = "db"
[[database.contract]]
name = "c"
messages = [{ message_type = "DEFAULT", sent_by = "any" }]
[[database.queue]]
name = "q"
[[database.service]]
name = "s"
queue = "q"
contracts = ["DEFAULT", "c"]
""",
    )
    db = cfg.database("db")
    assert db.message_types == ()
    assert db.contracts == (ContractConfig("c", (ContractMessage("DEFAULT", "any"),)),)
    assert db.services[0].contracts == ("DEFAULT", "c")


def test_results_are_frozen_and_use_tuples(tmp_path: Path) -> None:
    cfg = load(tmp_path, rest=SHOP)
    assert isinstance(cfg.databases, tuple)
    with pytest.raises(AttributeError):
        cfg.endpoint.port = 1  # type: ignore[misc]
    assert VALIDATIONS == ("none", "empty", "well_formed_xml")
    assert SENT_BY == ("initiator", "target", "any")


# ---------------------------------------------------------------------------- paths


def test_relative_paths_resolve_against_the_file_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc = tmp_path / "etc" / "brokerd"
    etc.mkdir(parents=True)
    path = write(
        etc,
        config_text(rest='[client]\ntoken_file = "secrets/token"\n', data_dir='data_dir = "var"\n'),
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(path)
    assert cfg.data_dir == etc / "var"
    assert cfg.endpoint.certificate == etc / "certs" / "a.pem"
    assert cfg.endpoint.ca_certificate == etc / "certs" / "ca.pem"
    assert cfg.client.token_file == etc / "secrets" / "token"


def test_relative_config_path_gives_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, config_text(data_dir='data_dir = "/srv/brokerd"\n'))
    monkeypatch.chdir(tmp_path)
    cfg = load_config("broker.toml")
    assert cfg.path == tmp_path / "broker.toml"
    assert cfg.data_dir == Path("/srv/brokerd")
    assert cfg.endpoint.private_key == tmp_path / "certs" / "a.key"
    assert cfg.client.token_file == Path("/srv/brokerd/client.token")


def test_certificate_files_are_not_checked_here(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    assert not cfg.endpoint.certificate.exists()


# ---------------------------------------------------------------------------- lifetime


def route_with(lifetime: str) -> str:
    return f"""
[[database]]
name = "db"
[[database.route]]
name = "r"
address = "LOCAL"
lifetime = {lifetime}
"""


def test_lifetime_in_seconds_counts_from_now(tmp_path: Path) -> None:
    path = write(tmp_path, config_text(rest=route_with("3600")))
    cfg = parse_config(path.read_text(), path, now=NOW)
    lifetime = cfg.database("db").routes[0].lifetime
    assert lifetime == NOW + timedelta(hours=1)
    assert lifetime is not None and lifetime.tzinfo is not None
    cfg = parse_config(config_text(rest=route_with("0.5")), path, now=NOW)
    assert cfg.database("db").routes[0].lifetime == NOW + timedelta(seconds=0.5)


def test_lifetime_seconds_default_now_is_current_time(tmp_path: Path) -> None:
    before = datetime.now(UTC)
    cfg = load(tmp_path, rest=route_with("60"))
    after = datetime.now(UTC)
    lifetime = cfg.database("db").routes[0].lifetime
    assert lifetime is not None
    assert before + timedelta(seconds=60) <= lifetime <= after + timedelta(seconds=60)


def test_lifetime_as_offset_datetime_is_converted_to_utc(tmp_path: Path) -> None:
    path = write(tmp_path, config_text(rest=route_with("2031-06-01T12:00:00+02:00")))
    cfg = parse_config(path.read_text(), path, now=NOW)
    lifetime = cfg.database("db").routes[0].lifetime
    assert lifetime == datetime(2031, 6, 1, 10, 0, tzinfo=UTC)
    assert lifetime is not None and lifetime.utcoffset() == timedelta(0)
    assert lifetime.tzinfo == UTC
    assert lifetime != datetime(2031, 6, 1, 10, 0, tzinfo=timezone(timedelta(hours=1)))


def test_route_address_normalisation(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        rest=f"""
[[database]]
name = "db"
[[database.route]]
name = "a"
address = "local"
[[database.route]]
name = "b"
address = "Transport"
[[database.route]]
name = "c"
address = "TCP://Broker.Example:04022"
mirror_address = "tcp://[::1]:4022"
broker_instance = "{UUID1}"
[[database.route]]
name = "AutoCreatedLocal"
address = "LOCAL"
""",
    )
    routes = cfg.database("db").routes
    assert [r.address for r in routes] == [
        "LOCAL",
        "TRANSPORT",
        "tcp://Broker.Example:4022",
        "LOCAL",
    ]
    assert routes[2].mirror_address == "tcp://[::1]:4022"
    assert routes[2].broker_instance == uuid.UUID(UUID1)
    assert routes[3] == RouteConfig("AutoCreatedLocal", "LOCAL")


# ---------------------------------------------------------------------------- parse_tcp_address


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("tcp://127.0.0.1:4022", ("127.0.0.1", 4022)),
        ("TCP://host.example:1", ("host.example", 1)),
        ("tcp://[::1]:65535", ("::1", 65535)),
        ("tcp://under_score-host:80", ("under_score-host", 80)),
        ("tcp://host2.Adventure-Works.com:4022/", ("host2.Adventure-Works.com", 4022)),
    ],
)
def test_parse_tcp_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_tcp_address(address) == expected


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1:4022",
        "http://h:80",
        "tcp://h",
        "tcp://:4022",
        "tcp://h:0",
        "tcp://h:65536",
        "tcp://h:port",
        "tcp://h:4022/path",
        "tcp://h:4022//",
        "tcp://user@h:4022",
        "tcp://::1:4022",
        "tcp://[::1:4022",
        "tcp://[nothex]:4022",
        "tcp://[::1]4022",
        "tcp://h:-1",
        "tcp://h:\uff14\uff10\uff12\uff12",  # full-width digits
        "",
    ],
)
def test_parse_tcp_address_refuses(address: str) -> None:
    with pytest.raises(ValueError):
        parse_tcp_address(address)


# ---------------------------------------------------------------------------- errors: file level


def test_toml_syntax_error(tmp_path: Path) -> None:
    err = expect_error(tmp_path, 'data_dir = "x"\n[endpoint\n', "", "line 2")
    assert "invalid TOML" in err.problem
    assert str(err).startswith(f"{tmp_path / 'broker.toml'}: invalid TOML")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "cannot read" in str(info.value)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_bytes(b'data_dir = "\xff"\n')
    with pytest.raises(ConfigError, match="UTF-8"):
        load_config(path)


def test_unknown_key_typo_is_named_with_the_allowed_keys(tmp_path: Path) -> None:
    err = expect_error(
        tmp_path,
        config_text(rest=SHOP.replace('name = "ShopQueue"', 'name = "ShopQueue"\nstauts = "on"')),
        "database[0].queue[0].stauts",
        "unknown key 'stauts' (did you mean 'status'?)",
    )
    assert (
        "allowed keys here: activation, name, poison_message_handling, poison_rollbacks, "
        "retention, status" in err.problem
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (config_text(data_dir='data_dir = "d"\ndatabse = 1\n'), "databse"),
        (config_text(endpoint="prot = 1"), "endpoint.prot"),
        (config_text(rest="[retry]\nmaximun = 3\n"), "retry.maximun"),
        (config_text(rest="[client]\ntokens = 'x'\n"), "client.tokens"),
        (config_text(rest="[limits]\nfragment = 2048\n"), "limits.fragment"),
        (config_text(rest='[[database]]\nname = "d"\nqueues = []\n'), "database[0].queues"),
        (
            config_text(
                rest='[[database]]\nname = "d"\n[[database.contract]]\nname = "c"\n'
                'messages = [{ message_type = "DEFAULT", sentby = "any" }]\n'
            ),
            "database[0].contract[0].messages[0].sentby",
        ),
        (
            config_text(
                rest='[[database]]\nname = "d"\n[[database.route]]\nname = "r"\n'
                'address = "LOCAL"\nservice_name = "x"\n'
            ),
            "database[0].route[0].service_name",
        ),
    ],
)
def test_unknown_keys_everywhere(tmp_path: Path, text: str, key: str) -> None:
    expect_error(tmp_path, text, key, "unknown key")


# ---------------------------------------------------------------------------- errors: instance


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (ENDPOINT, "data_dir", "is required"),
        (config_text(data_dir="data_dir = 5\n"), "data_dir", "must be a string, not the integer 5"),
        (config_text(data_dir='data_dir = ""\n'), "data_dir", "must not be empty"),
        ('data_dir = "d"\n', "endpoint", "is required"),
        ('data_dir = "d"\nendpoint = 4\n', "endpoint", "must be a table"),
        (
            'data_dir = "d"\n[endpoint]\nprivate_key = "k"\nca_certificate = "c"\n',
            "endpoint.certificate",
            "is required",
        ),
        (
            'data_dir = "d"\n[endpoint]\ncertificate = "c"\nca_certificate = "c"\n',
            "endpoint.private_key",
            "is required",
        ),
        (
            'data_dir = "d"\n[endpoint]\ncertificate = "c"\nprivate_key = "k"\n',
            "endpoint.ca_certificate",
            "is required",
        ),
        (
            'data_dir = "d"\n[endpoint]\ncertificate = 1\nprivate_key = "k"\n'
            'ca_certificate = "c"\n',
            "endpoint.certificate",
            "must be a string",
        ),
        (
            config_text(endpoint='port = "4022"'),
            "endpoint.port",
            "must be an integer, not the string",
        ),
        (config_text(endpoint="port = true"), "endpoint.port", "not the boolean true"),
        (config_text(endpoint="port = 4022.0"), "endpoint.port", "not the float"),
        (config_text(endpoint="port = 0"), "endpoint.port", "between 1 and 65535, not 0"),
        (config_text(endpoint="port = 65536"), "endpoint.port", "between 1 and 65535"),
        (config_text(endpoint='host = ""'), "endpoint.host", "must not be empty"),
        (config_text(endpoint='host = "a b"'), "endpoint.host", "not a host name"),
        (
            config_text(endpoint='encryption = "maybe"'),
            "endpoint.encryption",
            "required, supported",
        ),
        (config_text(endpoint="encryption = true"), "endpoint.encryption", "must be a string"),
        (
            config_text(endpoint='message_forwarding = "yes"'),
            "endpoint.message_forwarding",
            "true or false",
        ),
        (
            config_text(endpoint="message_forwarding = 1"),
            "endpoint.message_forwarding",
            "true or false",
        ),
        (
            config_text(endpoint="message_forward_size = -1"),
            "endpoint.message_forward_size",
            "at least 0",
        ),
        (
            config_text(endpoint="message_forward_size = 1.5"),
            "endpoint.message_forward_size",
            "integer",
        ),
        (config_text(endpoint="max_frame_size = 1000"), "endpoint.max_frame_size", "between 32768"),
        (
            config_text(endpoint="fragments_per_frame = 0"),
            "endpoint.fragments_per_frame",
            "between 1",
        ),
        (
            config_text(endpoint="fragments_per_frame = 4097"),
            "endpoint.fragments_per_frame",
            "4096",
        ),
        (
            config_text(endpoint="max_frame_size = 4294967296"),
            "endpoint.max_frame_size",
            "4294967295",
        ),
        (
            config_text(endpoint="idle_timeout = 0"),
            "endpoint.idle_timeout",
            "positive number of seconds",
        ),
        (config_text(endpoint="connect_timeout = -1"), "endpoint.connect_timeout", "positive"),
        (config_text(endpoint="idle_timeout = nan"), "endpoint.idle_timeout", "positive"),
        (config_text(endpoint="idle_timeout = inf"), "endpoint.idle_timeout", "positive"),
        (config_text(endpoint='idle_timeout = "90"'), "endpoint.idle_timeout", "number of seconds"),
        (
            config_text(endpoint="idle_timeout = false"),
            "endpoint.idle_timeout",
            "number of seconds",
        ),
        (config_text(endpoint="reconnect_initial = 0"), "endpoint.reconnect_initial", "positive"),
        (config_text(endpoint="reconnect_max = -2"), "endpoint.reconnect_max", "positive"),
        (
            config_text(endpoint="reconnect_initial = 3"),
            "endpoint.reconnect_initial",
            "must not exceed endpoint.reconnect_max (2.0)",
        ),
        (config_text(data_dir='data_dir = "d"\nretry = 5\n'), "retry", "must be a table"),
        (config_text(rest="[retry]\ninitial = 0\n"), "retry.initial", "positive"),
        (config_text(rest="[retry]\nmaximum = -1\n"), "retry.maximum", "positive"),
        (config_text(rest="[retry]\nack_delay = 0\n"), "retry.ack_delay", "positive"),
        (config_text(rest="[retry]\ndelayed_retry = 0\n"), "retry.delayed_retry", "positive"),
        (config_text(rest="[retry]\nredial_after = 0\n"), "retry.redial_after", "between 1"),
        (
            config_text(endpoint="heartbeat_interval = 0"),
            "endpoint.heartbeat_interval",
            "positive",
        ),
        (
            config_text(endpoint="heartbeat_deadline = 5"),
            "endpoint.heartbeat_deadline",
            "must exceed endpoint.heartbeat_interval (5.0)",
        ),
        (
            config_text(rest="[retry]\ninitial = 10\nmaximum = 5\n"),
            "retry.initial",
            "must not exceed retry.maximum (5.0)",
        ),
        (
            config_text(rest="[retry]\ninitial = 100\n"),
            "retry.initial",
            "must not exceed retry.maximum (64.0)",
        ),
        (config_text(rest="[client]\nport = 0\n"), "client.port", "between 1 and 65535"),
        (config_text(rest="[client]\nport = 4022\n"), "client.port", "also endpoint.port"),
        (
            config_text(endpoint='host = "0.0.0.0"\nport = 4023'),
            "client.port",
            "also endpoint.port",
        ),
        (config_text(rest='[client]\nhost = ""\n'), "client.host", "must not be empty"),
        (
            config_text(rest='[client]\nhost = "0.0.0.0"\n'),
            "client.host",
            "not a loopback address: a client listener reachable from other hosts must use TLS",
        ),
        (
            config_text(rest='[client]\nhost = "192.0.2.7"\n'),
            "client.host",
            "set client.tls_certificate and client.tls_private_key",
        ),
        (
            config_text(rest='[client]\nhost = "0.0.0.0"\nallow_remote = true\n'),
            "client.allow_remote",
            "is no longer accepted: a client listener on an address that is not loopback needs TLS",
        ),
        (
            config_text(rest='[client]\ntls_certificate = "c.pem"\n'),
            "client.tls_private_key",
            "is required with client.tls_certificate",
        ),
        (
            config_text(rest='[[client.token]]\nname = "shop"\nfile = "shop.token"\n'),
            "client.token[0].role",
            "is required (one of admin, application)",
        ),
        (
            config_text(rest='[[client.token]]\nname = "shop"\nfile = "s.token"\nrole = "app"\n'),
            "client.token[0].role",
            "must be one of admin, application",
        ),
        (
            config_text(
                rest='[[client.token]]\nname = "shop"\nfile = "s.token"\nrole = "application"\n'
            ),
            "client.token[0].services",
            "needs the services it may use",
        ),
        (
            config_text(
                rest='[[client.token]]\nname = "ops"\nfile = "o.token"\nrole = "admin"\n'
                'queues = ["Q"]\n'
            ),
            "client.token[0].queues",
            "an admin token may do everything",
        ),
        (
            config_text(
                rest='[[client.token]]\nname = "a"\nfile = "a.token"\nrole = "admin"\n'
                '[[client.token]]\nname = "a"\nfile = "b.token"\nrole = "admin"\n'
            ),
            "client.token[1].name",
            "client token 'a' is already defined at client.token[0]",
        ),
        (config_text(rest="[client]\ntoken_file = 3\n"), "client.token_file", "must be a string"),
        (
            config_text(rest="[limits]\nmax_message_size = 0\n"),
            "limits.max_message_size",
            "between 1 and 134217728",
        ),
        (  # a received message must fit one client frame
            config_text(rest="[limits]\nmax_message_size = 134217729\n"),
            "limits.max_message_size",
            "between 1 and 134217728",
        ),
        (
            config_text(rest="[limits]\nmax_message_size = true\n"),
            "limits.max_message_size",
            "integer",
        ),
        (
            config_text(rest="[limits]\nbacklog_page = 0\n"),
            "limits.backlog_page",
            "at least 1",
        ),
        (  # SQLite's cache_size counts KiB in 32 bits: more would silently be no cache
            config_text(rest="[limits]\npage_cache_mb = 4097\n"),
            "limits.page_cache_mb",
            "between 1 and 4096",
        ),
        (  # a segment's offsets have 40 bits; one is deleted or compacted whole
            config_text(rest="[limits]\nbody_segment_mb = 0\n"),
            "limits.body_segment_mb",
            "between 1 and 1024",
        ),
        (
            config_text(rest="[limits]\nbody_compact_after = -1\n"),
            "limits.body_compact_after",
            "positive number of seconds",
        ),
        (
            config_text(rest="[limits]\nsend_window = 0\n"),
            "limits.send_window",
            "between 1 and 1000000",
        ),
        (  # a backlog's messages may have the larger bound, never a smaller one
            config_text(rest="[limits]\nsend_window = 3000\nbacklog_send_window = 2999\n"),
            "limits.backlog_send_window",
            "must not be below limits.send_window (3000)",
        ),
        (
            config_text(rest="[limits]\nsend_window_mb = 0\n"),
            "limits.send_window_mb",
            "between 1 and 4096",
        ),
        (
            config_text(rest="[limits]\nfragment_size = 1023\n"),
            "limits.fragment_size",
            "between 1024",
        ),
        (
            config_text(rest=f"[limits]\nfragment_size = {DEFAULT_MAX_FRAME_SIZE - 8191}\n"),
            "limits.fragment_size",
            f"between 1024 and {DEFAULT_MAX_FRAME_SIZE - 8192}",
        ),
        (
            config_text(
                endpoint="max_frame_size = 40000", rest="[limits]\nfragment_size = 32000\n"
            ),
            "limits.fragment_size",
            "between 1024 and 31808",
        ),
    ],
)
def test_instance_settings_are_validated(tmp_path: Path, text: str, key: str, problem: str) -> None:
    expect_error(tmp_path, text, key, problem)


def test_fragment_size_bounds_are_inclusive(tmp_path: Path) -> None:
    top = DEFAULT_MAX_FRAME_SIZE - 8192
    assert load(tmp_path, rest=f"[limits]\nfragment_size = {top}\n").limits.fragment_size == top
    assert load(tmp_path, rest="[limits]\nfragment_size = 1024\n").limits.fragment_size == 1024


def test_the_backlog_page_is_read(tmp_path: Path) -> None:
    assert load(tmp_path).limits.backlog_page == 256
    assert load(tmp_path, rest="[limits]\nbacklog_page = 16\n").limits.backlog_page == 16


# ---------------------------------------------------------------------------- errors: databases


def db(body: str, name: str = "shop") -> str:
    return config_text(rest=f'[[database]]\nname = "{name}"\n{body}')


def contract(name: str, messages: str) -> str:
    return f'[[database.contract]]\nname = "{name}"\nmessages = [{messages}]\n'


QUEUE_Q = '[[database.queue]]\nname = "q"\n'
SERVICE_S = '[[database.service]]\nname = "s"\nqueue = "q"\n'
LONG = "x" * (MAX_NAME_BYTES + 1)
LONG_UTF8 = "é" * (MAX_NAME_BYTES // 2 + 1)  # fewer characters than the limit, more bytes


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        # databases
        (config_text(rest="[database]\nname = 'x'\n"), "database", "must be an array of tables"),
        (config_text(rest="[[database]]\n"), "database[0].name", "is required"),
        (db("", name=""), "database[0].name", "must not be empty"),
        (db("", name="my shop"), "database[0].name", "only letters, digits, '_' and '-'"),
        (db("", name="../etc"), "database[0].name", "it becomes a file name"),
        (db("", name="master"), "database[0].name", "'master' is reserved"),
        (db("", name="Master"), "database[0].name", "'master' is reserved"),
        (db("", name="MSDB"), "database[0].name", "write the msdb database's name as 'msdb'"),
        (
            db('[[database]]\nname = "Shop"\n'),
            "database[1].name",
            "database 'Shop' is already defined at database[0]",
        ),
        (db('broker_instance = "not-a-uuid"\n'), "database[0].broker_instance", "is not a UUID"),
        (db("broker_instance = 5\n"), "database[0].broker_instance", "must be a string"),
        (
            db(
                f'broker_instance = "{UUID1}"\n'
                f'[[database]]\nname = "b"\nbroker_instance = "{UUID1}"\n'
            ),
            "database[1].broker_instance",
            "is already used by database[0]",
        ),
        # names
        (db(f'[[database.queue]]\nname = "{LONG}"\n'), "database[0].queue[0].name", "1025 bytes"),
        (
            db(f'[[database.service]]\nname = "{LONG_UTF8}"\nqueue = "q"\n'),
            "database[0].service[0].name",
            f"at most {MAX_NAME_BYTES}",
        ),
        (
            db('[[database.message_type]]\nname = ""\n'),
            "database[0].message_type[0].name",
            "must not be empty",
        ),
        (
            db("[[database.message_type]]\nvalidation = 'none'\n"),
            "database[0].message_type[0].name",
            "is required",
        ),
        (db("[[database.queue]]\nname = 7\n"), "database[0].queue[0].name", "must be a string"),
        # message types
        (
            db('[[database.message_type]]\nname = "m"\nvalidation = "xml"\n'),
            "database[0].message_type[0].validation",
            "must be one of none, empty, well_formed_xml, not 'xml'",
        ),
        (
            db('[[database.message_type]]\nname = "m"\n[[database.message_type]]\nname = "m"\n'),
            "database[0].message_type[1].name",
            "message type 'm' is already defined in database 'shop' at database[0].message_type[0]",
        ),
        (
            db('[[database.message_type]]\nname = "DEFAULT"\n'),
            "database[0].message_type[0].name",
            "'DEFAULT' is built in",
        ),
        (db("message_type = 3\n"), "database[0].message_type", "must be an array of tables"),
        (db("message_type = [1]\n"), "database[0].message_type[0]", "must be a table"),
        # contracts
        (
            db(contract("DEFAULT", '{message_type = "DEFAULT", sent_by = "any"}')),
            "database[0].contract[0].name",
            "'DEFAULT' is built in",
        ),
        (
            db('[[database.contract]]\nname = "c"\n'),
            "database[0].contract[0].messages",
            "is required",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = []\n'),
            "database[0].contract[0].messages",
            "needs at least one message type",
        ),
        (
            db(contract("c", '{message_type = "m", sent_by = "any"}')),
            "database[0].contract[0].messages[0].message_type",
            "message type 'm' is not defined in database 'shop'",
        ),
        (
            db(
                '[[database.message_type]]\nname = "//A"\n'
                + contract("c", '{message_type = "//a", sent_by = "any"}')
            ),
            "database[0].contract[0].messages[0].message_type",
            "case-sensitive: did you mean '//A'?",
        ),
        (
            db(contract("c", '{message_type = "DEFAULT", sent_by = "both"}')),
            "database[0].contract[0].messages[0].sent_by",
            "must be one of initiator, target, any, not 'both'",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = [{message_type = "DEFAULT"}]\n'),
            "database[0].contract[0].messages[0].sent_by",
            "is required",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = [{sent_by = "any"}]\n'),
            "database[0].contract[0].messages[0].message_type",
            "is required",
        ),
        (
            db(
                contract(
                    "c",
                    '{message_type = "DEFAULT", sent_by = "initiator"}, '
                    '{message_type = "DEFAULT", sent_by = "target"}',
                )
            ),
            "database[0].contract[0].messages[1].message_type",
            "listed twice",
        ),
        (
            db('[[database.contract]]\nname = "c"\nmessages = ["DEFAULT"]\n'),
            "database[0].contract[0].messages[0]",
            "must be a table",
        ),
        (
            db(
                contract("c", '{message_type = "DEFAULT", sent_by = "any"}')
                + contract("c", '{message_type = "DEFAULT", sent_by = "any"}')
            ),
            "database[0].contract[1].name",
            "contract 'c' is already defined",
        ),
        # queues
        (
            db('[[database.queue]]\nname = "q"\nstatus = "maybe"\n'),
            "database[0].queue[0].status",
            'must be "on", "off", true or false',
        ),
        (
            db('[[database.queue]]\nname = "q"\nstatus = 1\n'),
            "database[0].queue[0].status",
            "not the integer 1",
        ),
        (
            db('[[database.queue]]\nname = "q"\nretention = "no"\n'),
            "database[0].queue[0].retention",
            "true or false",
        ),
        (
            db('[[database.queue]]\nname = "q"\npoison_message_handling = "pause"\n'),
            "database[0].queue[0].poison_message_handling",
            "must be one of quarantine, disable, off",
        ),
        (
            db('[[database.queue]]\nname = "q"\npoison_rollbacks = 0\n'),
            "database[0].queue[0].poison_rollbacks",
            "must be between 1 and 1000000",
        ),
        (
            db('[[database.queue]]\nname = "Q"\n[[database.queue]]\nname = "q"\n'),
            "database[0].queue[1].name",
            "queue 'q' is already defined in database 'shop' at database[0].queue[0] "
            "(compared without regard to case)",
        ),
        # services
        (
            db('[[database.service]]\nname = "s"\nqueue = "X"\n'),
            "database[0].service[0].queue",
            "queue 'X' is not defined in database 'shop'",
        ),
        (
            db(
                '[[database.queue]]\nname = "ShopQueue"\n'
                '[[database.service]]\nname = "s"\nqueue = "shopqueue"\n'
            ),
            "database[0].service[0].queue",
            "did you mean 'ShopQueue'?",
        ),
        (db('[[database.service]]\nname = "s"\n'), "database[0].service[0].queue", "is required"),
        (
            db(QUEUE_Q + SERVICE_S + 'contracts = ["nope"]\n'),
            "database[0].service[0].contracts[0]",
            "contract 'nope' is not defined in database 'shop'",
        ),
        (
            db(QUEUE_Q + SERVICE_S + 'contracts = "DEFAULT"\n'),
            "database[0].service[0].contracts",
            "must be an array of strings",
        ),
        (
            db(QUEUE_Q + SERVICE_S + 'contracts = ["DEFAULT", 1]\n'),
            "database[0].service[0].contracts[1]",
            "must be a non-empty string",
        ),
        (
            db(
                '[[database.queue]]\nname = "q"\n[[database.service]]\nname = "s"\nqueue = "q"\n'
                'contracts = ["DEFAULT", "DEFAULT"]\n'
            ),
            "database[0].service[0].contracts[1]",
            "listed twice",
        ),
        (
            db(
                '[[database.queue]]\nname = "q"\n[[database.service]]\nname = "//s"\nqueue = "q"\n'
                '[[database.service]]\nname = "//s"\nqueue = "q"\n'
            ),
            "database[0].service[1].name",
            "service '//s' is already defined in database 'shop'",
        ),
    ],
)
def test_database_objects_are_validated(tmp_path: Path, text: str, key: str, problem: str) -> None:
    expect_error(tmp_path, text, key, problem)


def test_service_names_are_case_sensitive(tmp_path: Path) -> None:
    """R-OBJ-4: //s and //S are two services."""
    cfg = load_config(
        write(
            tmp_path,
            db(
                '[[database.queue]]\nname = "q"\n[[database.service]]\nname = "//s"\nqueue = "q"\n'
                '[[database.service]]\nname = "//S"\nqueue = "q"\n'
            ),
        )
    )
    assert [s.name for s in cfg.database("shop").services] == ["//s", "//S"]


def test_names_at_the_byte_limit_are_accepted(tmp_path: Path) -> None:
    name = "é" * (MAX_NAME_BYTES // 2)
    cfg = load_config(write(tmp_path, db(f'[[database.message_type]]\nname = "{name}"\n')))
    assert cfg.database("shop").message_types[0].name == name


def test_same_object_names_in_two_databases_are_fine(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, config_text(rest=SHOP + SHOP.replace('"shop"', '"shop2"'))))
    assert cfg.database("shop").services == cfg.database("shop2").services


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
