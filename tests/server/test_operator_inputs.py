"""What an operator gives a daemon and ``brokerctl``, wrong: the configuration file and
the files it names (certificates, token files), the admin HTTP port under odd or
hostile clients, and ``brokerctl``'s own arguments. Each mistake is a clear error that
names the setting (or option), never a traceback, a silent default or a port that stops
answering.

Real daemons (in the test's process, or ``brokerd run``), real sockets, real files.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import pytest

from brokerd.config import load_config
from brokerd.errors import ConfigError
from brokerd.sdk.client import BrokerClient
from brokerd.tools import certs
from brokerd.tools.launcher import Deployment
from protocol.errors import BrokerError
from tests.commands import brokerctl, brokerd
from tests.config.helpers import config_text, write
from tests.daemons import SOLO_DATABASE, in_process, solo_broker


def assert_one_line_error(done: subprocess.CompletedProcess[str], prog: str) -> str:
    """The command failed with status 2 and one line ``PROG: error: ...`` (after the
    daemon's log lines, for ``brokerd run``), no traceback; that line."""
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    last = done.stderr.rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith(f"{prog}: error: "), done.stderr[-2000:]
    if prog == "brokerctl":
        assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    return last


def solo(root: Path, host: str, extra: str = "") -> Deployment:
    d = Deployment(root)
    d.add("solo", host, SOLO_DATABASE, extra=extra)
    return d


# --------------------------------------------------------------------------- tokens


def test_an_application_token_may_not_reuse_the_admin_token_file(tmp_path: Path) -> None:
    """R-CLIENT-2: an application token's secret must not be the admin token's. The login
    name selects the token and any unlisted name selects the admin token, so an
    application given a file that is also ``[client] token_file`` can log in under any
    other name as admin. The file is refused, naming the key."""
    text = config_text(
        rest=(
            '[client]\ntoken_file = "secrets/admin.token"\n'
            '[[client.token]]\nname = "shop"\nfile = "secrets/admin.token"\n'
            'role = "application"\nservices = ["//shop/S"]\n'
        )
    )
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "client.token[0].file", str(info.value)
    assert "token_file" in str(info.value)


async def test_an_empty_admin_token_file_stops_start_up(tmp_path: Path) -> None:
    """R-CLIENT-1: clients prove they hold the token. An admin token file that exists but
    is empty (a ``touch``, a failed copy) must stop start-up naming ``client.token_file``,
    not become an empty secret that anyone can prove."""
    host = "127.0.0.161"
    d = solo(tmp_path, host)
    daemon = d.daemons["solo"]
    daemon.token_file.parent.mkdir(parents=True, exist_ok=True)
    daemon.token_file.write_text("")
    try:
        async with in_process(daemon.config_path) as broker:
            client = await BrokerClient.connect(
                host, broker.config.client.port, token="", user="anyone", reconnect=False
            )
            async with client:
                rows = await client.view("queues")
            pytest.fail(
                f"the daemon started with an empty admin token file, and a client proving "
                f"the empty token logged in as {client.role!r} and read {len(rows)} queues"
            )
    except BrokerError as exc:
        assert "client.token_file" in str(exc), str(exc)


def test_a_token_file_that_is_not_text_is_named_at_start_up(tmp_path: Path) -> None:
    """R-CLIENT-1: a token file of binary garbage stops ``brokerd run`` with one line
    that says which file (and setting) is wrong."""
    d = solo(tmp_path, "127.0.0.162")
    daemon = d.daemons["solo"]
    daemon.token_file.parent.mkdir(parents=True, exist_ok=True)
    daemon.token_file.write_bytes(b"\xff\xfe\x00\x81 not a token")
    done = brokerd("run", "--config", str(daemon.config_path), timeout=60)
    line = assert_one_line_error(done, "brokerd")
    assert str(daemon.token_file) in line or "token_file" in line, line


# --------------------------------------------------------------------------- certificates


def _with_endpoint_file(d: Deployment, key: str, path: Path) -> Path:
    config = d.daemons["solo"].config_path
    lines = config.read_text().splitlines()
    lines = [f'{key} = "{path}"' if line.startswith(f"{key} =") else line for line in lines]
    config.write_text("\n".join(lines) + "\n")
    return config


async def test_a_private_key_that_is_not_the_certificates_stops_start_up(
    tmp_path: Path,
) -> None:
    """R-OBJ-7: the endpoint proves its certificate with its private key. A key of
    another certificate (same CA) would let the daemon start and then fail every
    handshake; it is refused at start-up, naming ``endpoint.private_key``."""
    d = solo(tmp_path, "127.0.0.163")
    other = certs.issue_instance(certs.read_pair(d.cert_dir, "ca"), "other")
    certs.write_pair(d.cert_dir, "other", other)
    config = _with_endpoint_file(d, "private_key", d.cert_dir / "other.key")
    try:
        async with in_process(config) as broker:
            pytest.fail(
                f"daemon {broker.instance_name} started with the private key of another certificate"
            )
    except ConfigError as exc:
        assert exc.key == "endpoint.private_key", str(exc)


async def test_an_unreadable_private_key_is_blamed_on_the_private_key(tmp_path: Path) -> None:
    """R-OBJ-7: when ``endpoint.private_key`` names a file that holds no private key, the
    error names ``endpoint.private_key``, not the (good) certificate."""
    d = solo(tmp_path, "127.0.0.164")
    config = _with_endpoint_file(d, "private_key", d.cert_dir / "ca.pem")
    with pytest.raises(ConfigError) as info:
        async with in_process(config):
            pass
    assert info.value.key == "endpoint.private_key", str(info.value)


# --------------------------------------------------------------------------- addresses


async def test_an_admin_listen_on_the_endpoints_address_names_the_key(tmp_path: Path) -> None:
    """R-OPS-1: a ``listen`` value that is the endpoint's address stops start-up with the
    key and the problem. ``localhost:4022`` is 127.0.0.1:4022, the endpoint's."""
    d = solo(tmp_path, "127.0.0.1", extra='[admin]\nlisten = "localhost:4022"\n')
    with pytest.raises(BrokerError) as info:
        async with in_process(d.daemons["solo"].config_path):
            pass
    assert "admin.listen" in str(info.value) or "[admin] listen" in str(info.value), str(info.value)


async def test_an_endpoint_host_that_does_not_resolve_names_the_key(tmp_path: Path) -> None:
    """R-OBJ-7: an ``endpoint.host`` that is no address of this machine stops start-up
    with an error that names ``endpoint.host``."""
    d = solo(tmp_path, "127.0.0.165")
    config = d.daemons["solo"].config_path
    config.write_text(
        config.read_text().replace(
            'host = "127.0.0.165"\nport = 4022', 'host = "no-such-host.invalid"\nport = 4022'
        )
    )
    assert "no-such-host.invalid" in config.read_text()
    with pytest.raises(BrokerError) as info:
        async with in_process(config):
            pass
    assert "endpoint.host" in str(info.value), str(info.value)


def test_a_deeply_nested_file_is_a_one_line_error(tmp_path: Path) -> None:
    """A file nested deeper than the parser can follow is an invalid configuration, told
    in one line naming the file, not a RecursionError traceback."""
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    done = brokerd("run", "--config", str(path), timeout=60)
    assert_one_line_error(done, "brokerd")
    assert str(path) in done.stderr


# --------------------------------------------------------------------------- admin HTTP


def _exchange(host: str, request: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection((host, 8022), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


async def test_a_request_head_over_16_kib_is_refused_whatever_its_size(tmp_path: Path) -> None:
    """R-OPS-1: a request head over 16 KiB is 431, also when it is 20 KiB and arrives in
    one piece (not only when it is far over)."""
    host = "127.0.0.166"
    async with solo_broker(tmp_path, host):
        head = (
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: "
            + b"a" * (20 * 1024)
            + b"\r\nConnection: close\r\n\r\n"
        )
        assert len(head) > 16 * 1024
        reply = await asyncio.to_thread(_exchange, host, head)
        assert reply.startswith(b"HTTP/1.1 431"), reply[:200]


async def test_idle_connections_do_not_silence_the_health_checks(tmp_path: Path) -> None:
    """R-OPS-1: ``/healthz`` answers 200 while the process runs, and ``/readyz`` says
    whether it is ready. Connections that open and send nothing (a port scanner, a
    half-open client, slow clients) must not leave the probes without an answer."""
    host = "127.0.0.167"
    async with solo_broker(tmp_path, host):
        idle = [socket.create_connection((host, 8022), timeout=10) for _ in range(80)]
        try:
            await asyncio.sleep(0.5)  # every one accepted and waiting for its request
            request = b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            reply = await asyncio.to_thread(_exchange, host, request)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        finally:
            for s in idle:
                s.close()


# --------------------------------------------------------------------------- brokerctl


def test_brokerctl_with_a_port_out_of_range_is_a_one_line_error(tmp_path: Path) -> None:
    """``--port`` is a TCP port, 1 to 65535: another value is one line naming the
    option (exit 2), not an OverflowError traceback."""
    token = tmp_path / "t.token"
    token.write_text("00" * 32 + "\n")
    for port in ("70000", "-1"):
        done = brokerctl("--token-file", str(token), "--port", port, "ping")
        assert_one_line_error(done, "brokerctl")
        assert "--port" in done.stderr or "port" in done.stderr, done.stderr


def test_brokerctl_with_a_token_file_that_is_not_text(tmp_path: Path) -> None:
    """A token file that is not text (a key file given by mistake) is one line naming
    the file, exit status 2, not a UnicodeDecodeError traceback."""
    token = tmp_path / "binary.token"
    token.write_bytes(b"\xff\xfe\x00\x81")
    done = brokerctl("--token-file", str(token), "ping")
    assert_one_line_error(done, "brokerctl")
    assert str(token) in done.stderr


async def test_brokerctl_route_lifetime_that_is_not_finite(tmp_path: Path) -> None:
    """R-OBJ-5: a route's lifetime is a positive number of seconds. ``--lifetime inf`` or
    ``nan`` is one line naming the option, exit 2, and no route is created or altered."""
    host = "127.0.0.168"
    async with solo_broker(tmp_path, host) as broker:
        config = str(broker.config.path)
        made = await asyncio.to_thread(
            brokerctl,
            "--config",
            config,
            "route",
            "create",
            "Solo",
            "Kept",
            "--address",
            "LOCAL",
            "--lifetime",
            "600",
        )
        assert made.returncode == 0, made.stderr
        for value in ("inf", "nan"):
            done = await asyncio.to_thread(
                brokerctl,
                "--config",
                config,
                "route",
                "create",
                "Solo",
                f"R{value}",
                "--address",
                "LOCAL",
                "--lifetime",
                value,
            )
            assert_one_line_error(done, "brokerctl")
            assert "--lifetime" in done.stderr, done.stderr
            done = await asyncio.to_thread(
                brokerctl,
                "--config",
                config,
                "route",
                "alter",
                "Solo",
                "Kept",
                "--lifetime",
                value,
            )
            assert_one_line_error(done, "brokerctl")
            assert "--lifetime" in done.stderr, done.stderr
