"""Reading the daemon's TOML configuration (brokerd/config/; SPEC R-OBJ-1..7) from real files:
the examples, the defaults, paths, lifetimes, addresses, and errors of the file itself."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from brokerd.config import (
    SENT_BY,
    VALIDATIONS,
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
from protocol.frames import DEFAULT_MAX_FRAME_SIZE
from tests.config.helpers import (
    SHOP,
    UUID1,
    config_text,
    expect_error,
    load,
    write,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "config"
"""The project's example configuration files."""
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

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


def test_admin_names_are_host_names_or_any(tmp_path: Path) -> None:
    """[admin] names (R-OPS-1): host names, kept in lower case without a final dot, once
    each; ``"*"`` alone for any name."""
    rest = (
        '[admin]\nlisten = "0.0.0.0:9100"\nnames = ["Broker.Example.", "broker.example", "b-2"]\n'
    )
    admin = load(tmp_path, rest=rest).admin
    assert (admin.names, admin.any_name) == (("broker.example", "b-2"), False)
    anyone = load(tmp_path, rest='[admin]\nlisten = "0.0.0.0:9100"\nnames = ["*"]\n').admin
    assert anyone.any_name


@pytest.mark.parametrize(
    ("names", "key", "problem"),
    [
        ('["*", "broker.example"]', "admin.names", "stands alone"),
        ('["broker.example:8022"]', "admin.names[0]", "is not a host name"),
        ('["ok", "two words"]', "admin.names[1]", "is not a host name"),
        ('"broker.example"', "admin.names", "must be an array of strings"),
        ('[""]', "admin.names[0]", "must be a non-empty string"),
    ],
)
def test_a_bad_admin_name_is_a_clear_error(
    tmp_path: Path, names: str, key: str, problem: str
) -> None:
    text = config_text(rest=f'[admin]\nlisten = "127.0.0.1:8030"\nnames = {names}\n')
    expect_error(tmp_path, text, key, problem)


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
        "tcp://broker.example:4022",  # a host name is compared without regard to case
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


def test_seconds_past_sql_servers_int_are_refused(tmp_path: Path) -> None:
    """A setting in seconds is bounded by SQL Server's INT (68 years): a timer or a date
    that far off would overflow when the daemon adds it to the clock."""
    text = config_text(rest="[limits]\nclosed_endpoint_keep = 1e300\n")
    expect_error(tmp_path, text, "limits.closed_endpoint_keep", "at most 2,147,483,647 seconds")
