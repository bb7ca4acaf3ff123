"""One broker instance: configuration, databases, engine, transport and client listener.

``brokerd run --config FILE`` builds a :class:`Broker` and runs it until SIGTERM
or SIGINT (R-OBJ-7: the endpoint on port 4022). It also runs the trace writer
(``brokerd.traces.writer``), flushed and closed last at shutdown. Start-up opens every database
file (msdb included), recovers endpoints and transmission queues from them,
then starts listening; shutdown closes connections, then commits what is
pending and closes the files. The commands of activated queues
(``brokerd.server.activation``) start once the client port listens and are stopped
first. The admin HTTP port (``brokerd.server.admin_http``: health, metrics, the web
console) starts before everything else and stops last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from cryptography import x509

from brokerd.config import BrokerConfig, load_config
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.engine import DialogEngine
from brokerd.errors import ConfigError
from brokerd.server.activation import ExternalActivation
from brokerd.server.admin_http.site import AdminPort
from brokerd.server.allocator import tune_allocator
from brokerd.server.client_access import Credentials
from brokerd.server.client_listener import ClientSession
from brokerd.server.client_tls import TlsAccept, server_context
from brokerd.server.interpreter import settle_garbage_collector, settle_switch_interval
from brokerd.server.mirroring_service import Mirroring
from brokerd.server.transport import Transport
from brokerd.traces.writer import TraceWriter
from protocol.errors import BrokerError
from protocol.security import Identity, key_of, load_signing_key

log = logging.getLogger("brokerd")
T = TypeVar("T")

CLIENT_STOP_GRACE = 10.0
"""Seconds a stopping daemon waits for the answers to the requests it has read (their
commits) before it closes the application connections anyway."""
CLIENT_REPLY_GRACE = 2.0
"""Seconds a stopping daemon then gives the closed connections' replies to leave."""


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        endpoint = config.endpoint
        for setting, path in (
            ("endpoint.certificate", endpoint.certificate),
            ("endpoint.private_key", endpoint.private_key),
            ("endpoint.ca_certificate", endpoint.ca_certificate),
        ):
            if not path.is_file():
                raise ConfigError(config.path, setting, f"file {path} does not exist")
        certificate = _load(
            config, "endpoint.certificate", endpoint.certificate, x509.load_pem_x509_certificate
        )
        signing_key = _load(config, "endpoint.private_key", endpoint.private_key, load_signing_key)
        cas = _load(
            config,
            "endpoint.ca_certificate",
            endpoint.ca_certificate,
            x509.load_pem_x509_certificates,
        )
        if not key_of(certificate, signing_key):
            raise ConfigError(
                config.path,
                "endpoint.private_key",
                f"{endpoint.private_key} is not the key of endpoint.certificate "
                f"{endpoint.certificate}",
            )
        try:
            self.identity = Identity(certificate, signing_key, tuple(cas))
            self.instance_name = self.identity.instance_name
        except ValueError as exc:
            raise ConfigError(config.path, "endpoint.certificate", f"cannot load: {exc}") from exc
        self.client_tls = server_context(config)
        self.credentials = Credentials(config.client, config.path)
        self.databases = {
            db.name: Database(db, config.data_dir, config.limits, cas) for db in config.databases
        }
        self.transport = Transport(endpoint, self.identity)
        self.trace = TraceWriter(config.trace, self.instance_name)
        for db in self.databases.values():  # outcomes after their events are on disk
            db.store.release_gate = self.trace.barrier
        self.engine = DialogEngine(config, self.databases, self.transport, trace=self.trace)
        self.transport.engine = self.engine
        self.mirroring = Mirroring(self.transport, self.engine)
        if self.mirroring:
            self.transport.mirroring = self.mirroring
            self.engine.router.mirroring = self.mirroring
        self.activation = ExternalActivation(config, self.databases, self.trace)
        self.client_sessions: set[ClientSession] = set()
        self.client_reads_held = 0
        """Times a client connection was not read for its pending request bytes."""
        self.client_sends_held = 0
        """Times a client connection was not read while its SENDs' link was congested."""
        self._client_server: asyncio.Server | None = None
        self._opened: list[Database] = []
        self.started_at = time.time()
        self.ready = False
        """Databases open and listeners up (the admin port's ``/readyz``)."""
        self.admin_port = AdminPort(self) if config.admin.enabled else None

    async def _start_admin_port(self) -> None:
        if self.admin_port is None:
            return
        try:
            await self.admin_port.start()
        except OSError as exc:
            raise BrokerError(
                f"cannot start: the admin port {self.config.admin.url} ([admin] listen in "
                f"{self.config.path}): {exc}"
            ) from exc

    @contextlib.contextmanager
    def _listening(self, section: str, host: str, port: int) -> Iterator[None]:
        """A listener's start: its failure (an address in use, a host that does not resolve)
        names the settings, not only the system's error."""
        try:
            yield
        except OSError as exc:
            raise BrokerError(
                f"cannot start: {section}.host {host!r} and {section}.port {port} in "
                f"{self.config.path}: {exc}"
            ) from exc

    async def start(self) -> None:
        self.started_at = time.time()
        try:
            await self._start_admin_port()
            for db in self.databases.values():
                await db.open()
                self._opened.append(db)
            self.mirroring.opened()
            await self.trace.start()
            await self.engine.start()
            settle_garbage_collector()
            settle_switch_interval()
            tune_allocator()
            endpoint, client = self.config.endpoint, self.config.client
            with self._listening("endpoint", endpoint.host, endpoint.port):
                await self.transport.start()
            if self.mirroring:
                self.mirroring.start()
            self.activation.take_over()  # the endpoint's address is this daemon's now
            loop = asyncio.get_running_loop()
            with self._listening("client", client.host, client.port):
                self._client_server = await loop.create_server(
                    self._client_connection, client.host, client.port, reuse_address=True
                )
            self.activation.start()
            self.ready = True
        except OSError as exc:
            await self.stop()
            raise BrokerError(f"cannot start: {exc}") from exc
        except BaseException:
            await self.stop()
            raise
        log.info(
            "brokerd %s listening on %s:%d (client %s:%d%s%s), databases %s",
            self.instance_name,
            self.config.endpoint.host,
            self.config.endpoint.port,
            self.config.client.host,
            self.config.client.port,
            " TLS" if self.client_tls else "",
            f", admin {self.config.admin.url}" if self.admin_port else "",
            ", ".join(f"{db.name}={db.broker_instance}" for db in self.databases.values()),
        )

    def _client_connection(self) -> asyncio.BaseProtocol:
        """A connection accepted on the client port: its session, or on a TLS port its
        TLS handshake, which hands the session the TLS transport once done (the session
        counts it from now, ``MAX_PENDING_LOGINS``)."""
        session = ClientSession(self, self.credentials)
        if self.client_tls is None:
            return session
        return TlsAccept(session, self.client_tls, self.config.client.login_timeout)

    async def stop(self) -> None:
        self.ready = False
        # The activated commands stop first, while the daemon still answers them: each
        # may finish (commit or roll back) the batch it holds; one stopped (or killed)
        # holding it puts it back uncounted, as every rollback of a graceful stop does.
        self.engine.receive_verbs.begin_stop()
        await self.activation.stop()
        if self._client_server is not None:
            self._client_server.close()
            self._client_server = None
            await self._stop_clients()
        await self.mirroring.stop()
        await self.transport.stop()
        await self.engine.stop()
        for db in self._opened:
            await db.store.close()
        self._opened = []
        await self.trace.stop()
        if self.admin_port is not None:
            await self.admin_port.stop()

    async def _stop_clients(self) -> None:
        """A graceful stop of the application connections: nothing more is read, each
        client is told the last request read, every request read is answered (a RECEIVE
        waiting for messages returns with none), then the connections close, their replies
        written. Requests still unanswered after :data:`CLIENT_STOP_GRACE` seconds (a
        commit that cannot finish) are left to the client's ``OutcomeUnknown``."""
        sessions = list(self.client_sessions)
        for session in sessions:
            session.stop_reading()
        self.engine.receive_verbs.stop_waiting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLIENT_STOP_GRACE
        while any(s.unanswered for s in sessions) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        for session in sessions:
            session.close()
        deadline = loop.time() + CLIENT_REPLY_GRACE  # the replies leave before the loop stops
        while self.client_sessions and loop.time() < deadline:
            await asyncio.sleep(0.005)


def install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(config_path: Path, ready_file: Path | None = None) -> None:
    config = load_config(config_path)
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_file is not None:  # after the handlers: a SIGTERM at once is a graceful stop
        ready_file.write_text(f"{os.getpid()}\n")
    try:
        await stop.wait()
    finally:
        log.info("brokerd %s stopping", broker.instance_name)
        await broker.stop()


def run(config_path: Path, ready_file: Path | None = None, log_level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_uvloop()
    # Database, WAL, trace and token files hold messages and secrets: only the daemon's
    # user may read them, whatever umask it was started with.
    os.umask(0o077)
    asyncio.run(serve(config_path, ready_file))


def _load(config: BrokerConfig, key: str, path: Path, parse: Callable[[bytes], T]) -> T:
    """The file of setting ``key``, parsed; a ConfigError naming ``key`` if it cannot be."""
    try:
        return parse(path.read_bytes())
    except (ValueError, TypeError, OSError) as exc:
        raise ConfigError(config.path, key, f"cannot load {path}: {exc}") from exc
