"""The shipped configurations load: config/example-*.toml, and the compose deployment
(docker-compose.yml, config/compose/) is what ``python -m brokerd.tools.compose write``
generates from the local cluster's topology (R-OPS-6), with every service's configuration
loading in the project and its ports, volumes and healthchecks agreeing."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from brokerd.config import load_config
from brokerd.config.addresses import parse_tcp_address
from brokerd.config.model import BrokerConfig
from brokerd.server.daemon import CLIENT_REPLY_GRACE, CLIENT_STOP_GRACE
from brokerd.tools import compose
from brokerd.tools.compose import ComposeDeployment
from brokerd.tools.launcher import STOP_WAIT
from brokerd.tools.topology import LOCAL
from brokerd.tools.yaml_text import dump
from brokerd.traces.segments import STOP_COMPACT_SECONDS

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
DEPLOYMENT = ComposeDeployment()
MODEL: dict[str, Any] = DEPLOYMENT.compose()  # docker-compose.yml is this, written (below)
SERVICES: dict[str, Any] = MODEL["services"]
BROKERS = [b.name for b in LOCAL.brokers]


@pytest.mark.parametrize("name", ["example-alpha", "example-beta"])
def test_shipped_configuration_loads(name: str) -> None:
    config = load_config(CONFIG / f"{name}.toml")
    assert config.endpoint.port == 4022
    assert config.client.host == config.endpoint.host
    routes = [r for db in config.databases for r in db.routes]
    assert routes and all(r.address.startswith("tcp://") for r in routes)


def test_committed_compose_files_are_what_the_topology_generates() -> None:
    """R-OPS-6: docker-compose.yml, config/compose/*.toml and the host-network override
    equal what the generator writes, and config/compose/ holds nothing else."""
    assert compose.stale(ROOT) == []
    assert (ROOT / compose.COMPOSE_FILE).read_text() == dump(MODEL, compose._compose_header())


def test_check_command_names_a_file_that_differs(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "brokerd.tools.compose"]
    env = {"PYTHONPATH": str(ROOT)}
    assert subprocess.run([*run, "write", str(tmp_path)], env=env, check=False).returncode == 0
    assert subprocess.run([*run, "check", str(tmp_path)], env=env, check=False).returncode == 0
    (tmp_path / "config/compose/hub.toml").write_text("# edited by hand\n")
    (tmp_path / "config/compose/old-broker.toml").write_text("")
    done = subprocess.run(
        [*run, "check", str(tmp_path)], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "hub.toml differs" in done.stdout and "old-broker.toml differs" in done.stdout


def _config(broker: str) -> BrokerConfig:
    return load_config(CONFIG / "compose" / f"{broker}.toml")


def _mounts(service: str) -> dict[str, str]:
    """Mount target -> source (a volume's name, or a ./path) of a service."""
    out = {}
    for spec in SERVICES[service].get("volumes", []):
        source, target = spec.split(":")[:2]
        out[target] = source
    return out


@pytest.mark.parametrize("broker", BROKERS)
def test_each_broker_configuration_loads_and_agrees_with_its_service(broker: str) -> None:
    config = _config(broker)
    service = SERVICES[broker]
    mounts = _mounts(broker)
    # Its own configuration file, data volume and trace volume.
    assert mounts[compose.BROKER_CONFIG] == f"./config/compose/{broker}.toml"
    assert service["command"] == ["run", "--config", compose.BROKER_CONFIG]
    assert mounts[str(config.data_dir)] == f"{broker}-data"
    assert config.trace.directory is not None
    assert mounts[str(config.trace.directory)] == f"{broker}-traces"
    # The endpoint: 4022 under the service's name, certificates from the certs volume.
    assert (config.endpoint.host, config.endpoint.port) == (broker, 4022)
    assert service["expose"] == ["4022"]
    assert mounts["/certs"] == "certs"
    assert config.endpoint.certificate == Path(f"/certs/{broker}.pem")
    assert config.endpoint.ca_certificate == Path("/certs/ca.pem")
    assert f"brokerd certs instance {broker} --dir /ca" in SERVICES["certs"]["command"][0]
    # The healthcheck asks the admin port's /readyz, where the configuration listens.
    probe = service["healthcheck"]["test"]
    assert probe[:3] == ["CMD", "python3", "-c"]
    assert f"'{config.admin.url}/readyz'" in probe[3]
    assert service["depends_on"]["certs"] == {"condition": "service_completed_successfully"}
    # The engine waits for the longest graceful stop before its SIGKILL.
    activation = [
        q.activation.stop_grace for db in config.databases for q in db.queues if q.activation
    ]
    longest_stop = (
        max(activation, default=0.0) + CLIENT_STOP_GRACE + CLIENT_REPLY_GRACE + STOP_COMPACT_SECONDS
    )
    assert float(service["stop_grace_period"].removesuffix("s")) > longest_stop
    assert longest_stop < STOP_WAIT  # the local cluster's launcher, the same configurations
    # The topology's routes, by service name.
    topology_broker = LOCAL.broker(broker)
    assert config.endpoint.message_forwarding == topology_broker.forwarding
    for db in config.databases:
        for route in db.routes:
            if route.address in ("LOCAL", "TRANSPORT"):
                continue
            host, port = parse_tcp_address(route.address)
            assert host in BROKERS and port == 4022
            if route.mirror_address:
                assert parse_tcp_address(route.mirror_address)[0] in BROKERS


def test_listeners_are_loopback_and_distinct_so_containers_can_share_a_namespace() -> None:
    """Client and admin listeners on each broker's own loopback address: no two services
    take the same address and port when all containers share one network namespace."""
    taken: set[tuple[str, int]] = set()
    override = DEPLOYMENT.host_override()["services"]
    for broker in BROKERS:
        config = _config(broker)
        address = DEPLOYMENT.hosts[broker]
        assert config.client.host == address and config.admin.host == address
        assert f"{broker}:{address}" in override[broker]["extra_hosts"]
        for listener in [(address, 4022), (address, config.client.port), (address, 8022)]:
            assert listener not in taken
            taken.add(listener)
    addresses = list(DEPLOYMENT.hosts.values())
    assert len(set(addresses)) == len(addresses)
    assert all(ipaddress.IPv4Address(a) in ipaddress.IPv4Network("127.0.0.0/8") for a in addresses)
    assert set(override) == set(SERVICES)
    for name, service in override.items():
        assert service["network_mode"] == "host"
        assert len(service["extra_hosts"]) == len(addresses)
        if name in compose.SPARK_SERVICES:
            assert service["environment"]["SPARK_LOCAL_IP"] == DEPLOYMENT.hosts[name]


def test_volumes_are_declared_and_each_broker_has_its_own() -> None:
    declared = set(MODEL["volumes"])
    used = {
        source
        for name in SERVICES
        for source in _mounts(name).values()
        if not source.startswith("./")
    }
    assert used == declared
    writers: dict[str, str] = {}
    for broker in BROKERS:
        for spec in SERVICES[broker]["volumes"]:
            source = spec.split(":")[0]
            if not spec.endswith(":ro"):
                assert source not in writers, f"{source} is written by {writers.get(source)} too"
                writers[source] = broker
    # The CA's private key stays in the certs job's own volume.
    assert all("ca" not in _mounts(name).values() for name in SERVICES if name != "certs")


def test_spark_job_reads_every_brokers_trace_volume() -> None:
    master = SERVICES["spark-master"]
    assert master["entrypoint"] == ["spark-class"]
    assert master["command"][0] == "org.apache.spark.deploy.master.Master"
    port = master["command"][master["command"].index("--port") + 1]
    url = f"spark://spark-master:{port}"
    worker = SERVICES["spark-worker"]
    assert worker["command"][:2] == ["org.apache.spark.deploy.worker.Worker", url]
    job = SERVICES["analyze"]
    command = job["command"]
    assert command[0] == "analyze"
    assert command[command.index("--master") + 1] == url
    paths = command[1 : command.index("--master")]
    assert len(paths) == len(BROKERS)
    for broker, path in zip(BROKERS, paths, strict=True):
        trace_volume = _mounts(broker)[str(_config(broker).trace.directory)]
        # The driver and the executors both see the volume where the job names it.
        assert _mounts("analyze")[path] == trace_volume
        assert _mounts("spark-worker")[path] == trace_volume
    out = command[command.index("--out") + 1]
    assert _mounts("analyze")["/reports"] == _mounts("spark-worker")["/reports"] == "reports"
    assert out.startswith("/reports/")
    assert job["profiles"] == ["jobs"]
    assert job["depends_on"]["spark-master"] == {"condition": "service_healthy"}


def test_dockerfile_is_multi_stage_with_the_targets_compose_builds_and_a_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)$", text, re.MULTILINE)
    assert len(stages) >= 3 and {"build", "broker", "spark"} <= set(stages)
    targets = {s["build"]["target"] for s in SERVICES.values()}
    assert targets <= set(stages)
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert users[-1] == "brokerd" and "root" not in users[-1:]
    assert "COPY --from=build" in text
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[1] == "*" and "!brokerd" in ignored


def test_yaml_writer_quotes_strings_and_nests_blocks() -> None:
    text = dump(
        {"a": {"b": ["x", 1, True], "c": [{"d": "no", "e": {}}]}, "f g": []},
        "a header",
    )
    assert text == (
        '# a header\na:\n  b: ["x", 1, true]\n  c:\n    - d: "no"\n      e: {}\n"f g": []\n'
    )


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


def test_the_lock_pins_every_dependency_pyproject_names() -> None:
    """``./dev setup`` installs from ``requirements.lock`` alone (with hashes): a dependency
    added to ``pyproject.toml`` without ``./dev lock`` would be missing on a fresh machine."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    names = {re.split(r"[<>=!~\[; ]", w, maxsplit=1)[0].lower().replace("_", "-") for w in wanted}
    locked = {
        m.group(1).lower().replace("_", "-")
        for m in re.finditer(
            r"^([A-Za-z0-9_.-]+)==", (root / "requirements.lock").read_text(), re.M
        )
    }
    assert sorted(names - locked) == []
