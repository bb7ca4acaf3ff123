"""The shipped configurations load: config/example-*.toml and the docker-compose variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import load_config

CONFIG = Path(__file__).resolve().parent.parent / "config"


@pytest.mark.parametrize("name", ["example-alpha", "example-beta", "compose-alpha", "compose-beta"])
def test_shipped_configuration_loads(name: str) -> None:
    config = load_config(CONFIG / f"{name}.toml")
    assert config.endpoint.port == 4022
    # The client listener stays on loopback (the endpoint's own address when that is one).
    expected_client = "127.0.0.1" if name.startswith("compose") else config.endpoint.host
    assert config.client.host == expected_client
    routes = [r for db in config.databases for r in db.routes]
    assert routes and all(r.address.startswith("tcp://") for r in routes)


def test_compose_file_names_both_configurations() -> None:
    text = (CONFIG.parent / "docker-compose.yml").read_text()
    assert "compose-alpha.toml" in text and "compose-beta.toml" in text and "4022" in text


def test_dynamic_routing_configuration_loads_with_its_table() -> None:
    from examples.dynamic_router import load_table

    config = load_config(CONFIG / "dynamic-routing.toml")
    app = config.database("app")
    assert [r.remote_service_name for r in app.routes] == ["SQL/ServiceBroker/BrokerConfiguration"]
    table = load_table(CONFIG / "dynamic-routes.toml")
    assert table["//warehouse/Orders"].address == "tcp://127.0.0.2:4022"


def test_dynamic_router_reads_a_missing_route_request() -> None:
    from brokerd.dialogs.router.requests import missing_route_body
    from examples.dynamic_router import parse_request, route_name

    body = missing_route_body("//remote/A&B", None, "AW")
    request = parse_request(body)
    assert (request.service, request.broker_instance, request.database) == (
        "//remote/A&B",
        None,
        "AW",
    )
    assert route_name("//remote/A&B") == "Dynamic_remote_A_B"
