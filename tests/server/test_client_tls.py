"""TLS on the client port (R-CLIENT-1; docs/design.md "Security defaults"): a daemon with
``[client] tls_certificate`` speaks TLS 1.2+ only, the SDK and brokerctl verify its
certificate, and a client listener off loopback is refused without TLS."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.admin.ctl import main as brokerctl
from brokerd.config import load_config
from brokerd.sdk.client import BrokerClient
from brokerd.server.client_tls import server_context
from brokerd.tools import certs
from brokerd.tools.example import warehouse_database
from brokerd.tools.launcher import Daemon, Deployment
from protocol.errors import ClientError
from tests.daemons import FAST_RETRY

HOST = "127.0.0.2"


def _beta(root: Path, client_tls: bool, client_extra: str = "") -> Deployment:
    d = Deployment(root, FAST_RETRY)
    d.add(
        "beta",
        HOST,
        warehouse_database(None),
        client_tls=client_tls,
        client_extra=client_extra,
    )
    return d


@pytest.fixture
def beta(tmp_path: Path) -> Iterator[Daemon]:
    d = _beta(tmp_path / "deployment", client_tls=True)
    try:
        d.start("beta")
        yield d.daemons["beta"]
    finally:
        d.stop_all()


async def test_a_tls_client_logs_in_and_works(beta: Daemon) -> None:
    async with await beta.client() as client:
        assert client.tls_version in ("TLSv1.2", "TLSv1.3")
        assert client.role == "admin"
        handle = await client.begin_dialog(
            "//warehouse/Orders", "//warehouse/Orders", "//shop/OrderContract"
        )
        await client.send(handle, "//shop/Order", b"<order/>")
        [message] = await client.receive("OrderQueue", timeout=5)
        assert message.message_body == b"<order/>"


async def test_large_bodies_cross_tls_both_ways(beta: Daemon) -> None:
    """A large SEND body and a large RECEIVE reply are read in place (the client
    listener's and the SDK's ``ClientFrameReader.get_buffer``) under TLS as in the clear,
    twice over, so the second reply is read into the first one's buffer."""
    async with await beta.client() as client:
        handle = await client.begin_dialog(
            "//warehouse/Orders", "//warehouse/Orders", "//shop/OrderContract"
        )
        bodies = [bytes([n]) * (3 * 1024 * 1024 + n) for n in range(4)]
        for body in bodies:
            await client.send(handle, "//shop/Order", body)
        got = await client.receive("OrderQueue", top=2, timeout=5)
        got += await client.receive("OrderQueue", top=2, timeout=5)
        assert [m.message_body for m in got] == bodies


async def test_a_plain_client_is_refused_on_a_tls_port(beta: Daemon) -> None:
    with pytest.raises(ClientError, match="does its client port require TLS"):
        await BrokerClient.connect(HOST, beta.client_port, token_file=beta.token_file, timeout=1)
    # Nothing readable reaches a plain socket: no challenge in clear, and the daemon hangs up.
    reader, writer = await asyncio.open_connection(HOST, beta.client_port)
    writer.write(b"BC\x01\x02" + bytes(12))
    try:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert b"nonce" not in data
    except ConnectionResetError:
        pass
    finally:
        writer.close()


def test_the_listener_accepts_tls_1_2_or_later_only(beta: Daemon) -> None:
    context = server_context(load_config(beta.config_path))
    assert context is not None
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2


async def test_a_client_that_does_not_trust_the_certificate_fails_clearly(
    beta: Daemon, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    certs.write_pair(other, "ca", certs.create_ca("someone else's CA"))
    with pytest.raises(ClientError, match=r"certificate is not trusted .*unable to get local"):
        await BrokerClient.connect(
            HOST, beta.client_port, token_file=beta.token_file, tls_ca_file=other / "ca.pem"
        )
    # the right CA, but a name the certificate does not carry
    with pytest.raises(ClientError, match=r"certificate is not trusted .*[Hh]ostname mismatch"):
        await BrokerClient.connect(
            HOST,
            beta.client_port,
            token_file=beta.token_file,
            tls_ca_file=beta.tls_ca_file,
            server_hostname="warehouse.example",
        )


def test_a_non_loopback_client_host_without_tls_is_refused_at_start_up(tmp_path: Path) -> None:
    d = _beta(tmp_path / "plain", client_tls=False)
    config = d.daemons["beta"].config_path
    config.write_text(
        config.read_text().replace(f'[client]\nhost = "{HOST}"', '[client]\nhost = "0.0.0.0"')
    )
    try:
        with pytest.raises(
            RuntimeError, match=r"client\.host: '0\.0\.0\.0' is not a loopback address"
        ):
            d.start("beta")
        # the old escape hatch is gone: it names what to do instead
        config.write_text(config.read_text().replace("[client]", "[client]\nallow_remote = true"))
        with pytest.raises(RuntimeError, match=r"client\.allow_remote: is no longer accepted.*TLS"):
            d.start("beta")
    finally:
        d.stop_all()  # a daemon that started by mistake must not hold the ports


def test_a_missing_or_wrong_tls_certificate_is_a_clear_start_up_error(tmp_path: Path) -> None:
    d = _beta(tmp_path / "missing", client_tls=True)
    config = d.daemons["beta"].config_path
    text = config.read_text()
    config.write_text(text.replace('tls_certificate = "', 'tls_certificate = "nowhere/'))
    try:
        with pytest.raises(RuntimeError, match=r"client\.tls_certificate: file .* does not exist"):
            d.start("beta")
        beta_pem, ca_pem = d.cert_dir / "beta.pem", d.cert_dir / "ca.pem"
        # a certificate that does not belong to the key
        config.write_text(
            text.replace(f'tls_certificate = "{beta_pem}"', f'tls_certificate = "{ca_pem}"')
        )
        with pytest.raises(RuntimeError, match=r"client\.tls_certificate: cannot load"):
            d.start("beta")
    finally:
        d.stop_all()


async def test_a_non_loopback_client_host_with_tls_serves_tls(tmp_path: Path) -> None:
    d = _beta(tmp_path / "tls", client_tls=True)
    daemon = d.daemons["beta"]
    config = daemon.config_path
    config.write_text(
        config.read_text().replace(f'[client]\nhost = "{HOST}"', '[client]\nhost = "0.0.0.0"')
    )
    try:
        d.start("beta")
        async with await daemon.client() as client:  # dials 127.0.0.2, named by the certificate
            assert client.tls_version is not None
            assert await client.ping()
    finally:
        d.stop_all()


def test_brokerctl_reaches_a_tls_client_port(
    beta: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    # From the daemon's own file: TLS and the deployment CA are taken from it.
    assert brokerctl(["--config", str(beta.config_path), "ping"]) == 0
    assert "beta" in capsys.readouterr().out
    explicit = [
        "--host",
        HOST,
        "--port",
        str(beta.client_port),
        "--token-file",
        str(beta.token_file),
    ]
    assert brokerctl([*explicit, "--tls-ca-file", str(beta.tls_ca_file), "queues"]) == 0
    assert "OrderQueue" in capsys.readouterr().out
    assert brokerctl([*explicit, "--timeout", "1", "ping"]) == 2
    assert "require TLS" in capsys.readouterr().err
