"""What a configuration file becomes: the frozen dataclasses, from one message type to
the whole :class:`BrokerConfig`, and the public enumerations their fields take."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from protocol.frames import DEFAULT_MAX_FRAME_SIZE, MAX_FRAGMENTS_PER_FRAME

VALIDATIONS = ("none", "empty", "well_formed_xml")
"""R-OBJ-1 message type validations."""
SENT_BY = ("initiator", "target", "any")
"""R-OBJ-2 roles that may send a message type on a contract."""
MIRROR_ROLES = ("principal", "mirror")
"""The roles of a mirrored database's partners (R-ROUTE-16)."""
MIRROR_WHEN_LOST = ("exposed", "stall")
"""Whether a principal whose mirror is lost goes on alone or holds its commits (R-ROUTE-16)."""


@dataclass(frozen=True)
class MessageTypeConfig:
    """R-OBJ-1."""

    name: str
    validation: str = "none"


@dataclass(frozen=True)
class ContractMessage:
    """One line of a contract (R-OBJ-2)."""

    message_type: str
    sent_by: str


@dataclass(frozen=True)
class ContractConfig:
    """R-OBJ-2."""

    name: str
    messages: tuple[ContractMessage, ...]


class PoisonHandling(enum.Enum):
    """What a queue does with a message rolled back ``poison_rollbacks`` times in a row
    (R-OBJ-3, SPEC §6): set its conversation aside, disable the queue (SQL Server's
    POISON_MESSAGE_HANDLING STATUS = ON), or nothing but count (STATUS = OFF)."""

    QUARANTINE = "quarantine"
    DISABLE = "disable"
    OFF = "off"


DEFAULT_POISON_ROLLBACKS = 5
"""Rollbacks of one message that make it a poison message (SQL Server's five)."""
MAX_POISON_ROLLBACKS = 1_000_000
"""The highest ``poison_rollbacks`` a queue may set."""


@dataclass(frozen=True)
class PoisonPolicy:
    """A queue's poison-message handling (SPEC §6): ``handling`` after ``rollbacks``
    rollbacks of the same message."""

    handling: PoisonHandling = PoisonHandling.QUARANTINE
    rollbacks: int = DEFAULT_POISON_ROLLBACKS


MAX_ACTIVATED_INSTANCES = 64
"""The most instances of an activated command one queue may run at once."""


@dataclass(frozen=True)
class ActivationConfig:
    """External activation of a queue (R-OBJ-3, SPEC §6 Decision on activation): the
    daemon starts ``command`` when the queue has messages that its readers do not
    drain, as SQL Server's external activator starts a program on a QUEUE_ACTIVATION
    event; at most ``max_instances`` at once."""

    command: tuple[str, ...]
    """The program and its arguments (no shell); run in the configuration file's
    directory (``directory``)."""
    directory: Path
    max_instances: int = 1
    user: str | None = None
    """The ``[[client.token]]`` whose token file and login name the command is given;
    None: the daemon's admin token."""
    interval: float = 5.0
    """Seconds at least between two starts of the command for the queue (Service Broker's
    queue monitor decides "every few seconds"); also how long no RECEIVE must have come
    back empty before another instance is started."""
    stop_grace: float = 10.0
    """Seconds an instance is given to exit after SIGTERM when the daemon stops, before
    SIGKILL."""


@dataclass(frozen=True)
class QueueConfig:
    """R-OBJ-3; ``status`` True means on."""

    name: str
    status: bool = True
    retention: bool = False
    poison: PoisonPolicy = field(default_factory=PoisonPolicy)
    activation: ActivationConfig | None = None


@dataclass(frozen=True)
class ServiceConfig:
    """R-OBJ-4; ``contracts`` are those the service accepts as a target."""

    name: str
    queue: str
    contracts: tuple[str, ...] = ()
    certificate: Path | None = None
    """The service's own certificate (EC P-256, from ``brokerd certs service``), for dialog
    security (R-DLG-14); with ``private_key``."""
    private_key: Path | None = None
    dialog_security: bool = False
    """``dialog_security = "required"``: every dialog this service begins or accepts is
    secured (R-DLG-14), as ENCRYPTION = ON; an unsecured one is refused."""


@dataclass(frozen=True)
class RemoteServiceBindingConfig:
    """The certificate of a service in another database or instance (R-DLG-14), as SQL
    Server's REMOTE SERVICE BINDING: dialogs begun to that service are secured with it, and
    dialogs it begins are checked against it."""

    service: str
    certificate: Path


@dataclass(frozen=True)
class RouteConfig:
    """R-OBJ-5; ``address`` is ``LOCAL``, ``TRANSPORT`` or a normalised ``tcp://host:port``."""

    name: str
    address: str
    remote_service_name: str | None = None
    broker_instance: uuid.UUID | None = None
    mirror_address: str | None = None
    lifetime: datetime | None = None
    """Absolute expiry, timezone-aware UTC; None = never expires."""


@dataclass(frozen=True)
class DatabaseConfig:
    """One database of the instance and its catalog (without the implicit DEFAULTs)."""

    name: str
    broker_instance: uuid.UUID | None = None
    message_types: tuple[MessageTypeConfig, ...] = ()
    contracts: tuple[ContractConfig, ...] = ()
    queues: tuple[QueueConfig, ...] = ()
    services: tuple[ServiceConfig, ...] = ()
    routes: tuple[RouteConfig, ...] = ()
    remote_service_bindings: tuple[RemoteServiceBindingConfig, ...] = ()
    mirror_role: str | None = None
    """``principal`` or ``mirror`` for a mirrored database (R-ROUTE-10); None = not mirrored."""
    mirror_partner: str | None = None
    """``tcp://host:port`` of the other partner: the database's committed units of work are
    shipped between them (R-ROUTE-16). None: the partners share only the identifier."""
    mirror_when_lost: str = "exposed"
    """R-ROUTE-16: with no mirror attached (or one silent for ``mirror_timeout``), the
    principal goes on alone (``exposed``) or holds every commit's outcome until a mirror
    has it (``stall``)."""
    mirror_timeout: float = 10.0
    """Seconds a principal waits for a confirmation before it deems the mirror lost."""


@dataclass(frozen=True)
class EndpointConfig:
    """R-OBJ-7: where the instance listens for other brokers, and how."""

    certificate: Path
    private_key: Path
    ca_certificate: Path
    host: str = "127.0.0.1"
    port: int = 4022
    encryption: str = "required"
    """``required`` | ``supported`` | ``disabled`` (``EncryptionMode[encryption.upper()]``)."""
    message_forwarding: bool = False
    message_forward_size: int = 10
    """MB of forwarded messages held in memory (R-ROUTE-7)."""
    max_hop_count: int = 32
    """A message already forwarded this many times is dropped, not forwarded (R-ROUTE-7)."""
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    idle_timeout: float = 90.0
    heartbeat_interval: float = 5.0
    """An open connection that has sent nothing for this long sends a heartbeat (R-PROTO-5)."""
    heartbeat_deadline: float = 20.0
    """An open connection that has received nothing for this long is closed, and an
    outgoing one dialled again (R-PROTO-5); must exceed ``heartbeat_interval``."""
    handshake_timeout: float = 10.0
    """A connection that has not completed its handshake by then is closed."""
    max_connections: int = 512
    """Incoming broker connections at once; more are closed when they arrive."""
    max_connections_per_address: int = 64
    """Incoming broker connections at once from one IP address."""
    fragments_per_frame: int = MAX_FRAGMENTS_PER_FRAME
    """Fragments one frame to another broker may carry (protocol version 2's FRAGMENTS
    frame: one seal and signature for all); 1 sends each in a frame of its own."""
    inbound_backlog_mb: int = 32
    """MB received from peers and not yet committed above which broker connections stop
    being read until a quarter of it is left (peers wait instead of resending)."""
    max_pending_handshakes: int = 128
    """Incoming connections still in their handshake at once; a new one beyond this (or
    beyond ``max_connections``) closes the oldest of them instead of being refused, so
    unauthenticated connections cannot keep a broker from completing its handshake."""
    connect_timeout: float = 5.0
    reconnect_initial: float = 1.0
    reconnect_max: float = 2.0
    """An unreachable peer is dialled again at most this long after the last attempt, so a
    peer that returns is reached within seconds (a refused attempt costs next to nothing);
    a connection from the peer itself makes the link dial at once."""


@dataclass(frozen=True)
class RetryConfig:
    """Timings in seconds: retransmission (R-DLG-6), acknowledgement delay, DELAYED re-routing."""

    initial: float = 4.0
    maximum: float = 64.0
    ack_delay: float = 0.02
    delayed_retry: float = 5.0
    redial_after: int = 4
    """A message retransmitted this many times on a connection that acknowledged nothing
    meanwhile makes the link close that connection and dial again (R-PROTO-5)."""


CLIENT_ROLES = ("admin", "application")
"""What a client token may do: everything, or the verbs on its own services and queues."""


@dataclass(frozen=True)
class ClientToken:
    """One ``[[client.token]]``: the login name that selects it, its secret's file and
    its role. An ``application`` token may BEGIN DIALOG from, SEND on and END the
    conversations of ``services`` and RECEIVE from ``queues`` (names in any database);
    nothing else. An ``admin`` token may do everything, as the ``token_file`` one."""

    name: str
    file: Path
    role: str
    services: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClientConfig:
    """The listener for the client SDK."""

    host: str
    port: int
    token_file: Path
    """The admin token, selected by any login name that no ``[[client.token]]`` has."""
    login_timeout: float = 10.0
    """A client connection that has not logged in (TLS handshake included) by then is
    closed."""
    tls_certificate: Path | None = None
    """With ``tls_private_key``: the listener speaks TLS (1.2 or later) only. Required when
    ``host`` is not a loopback address."""
    tls_private_key: Path | None = None
    tokens: tuple[ClientToken, ...] = ()

    @property
    def tls(self) -> bool:
        return self.tls_certificate is not None


@dataclass(frozen=True)
class LimitsConfig:
    """Sizes in bytes."""

    max_message_size: int = 100 * 1024 * 1024
    fragment_size: int = 64 * 1024
    held_bodies_mb: int = 64
    """MB of unacknowledged message bodies kept in memory from SEND until acknowledged;
    beyond it a body is read back from the database file whenever it is sent."""
    transit_bodies_mb: int = 16
    """MB of bodies not kept (read back, or beyond ``held_bodies_mb``) in memory at once
    while they wait to be written: a backlog is fed to a connection as it drains."""
    backlog_page: int = 256
    """Unacknowledged messages of one endpoint paged in from the file at once when it has a
    backlog (after a restart, or while its link is down): see
    ``brokerd.dialogs.endpoints.backlog``."""
    page_cache_mb: int = 2
    """MB of database pages SQLite keeps in memory for each database file (its page
    cache; 2 MB is SQLite's own default). With messages of a MB or more, a commit of a
    few of them outgrows a small cache: it spills pages to the file before its COMMIT
    and reads them back, and the deletion of an acknowledged body reads its pages back
    from the file. 64 MB gave W3 about 3.5 % more and cost a daemon holding a
    1,000,000-message backlog about 70 MB of RSS."""
    body_segment_mb: int = 64
    """MB of a segment file of large bodies (``brokerd.storage.body_files``) before the next
    one begins: a segment is deleted, or compacted, as a whole."""
    body_compact_after: float = 30.0
    """Seconds a segment of large bodies is left after it is closed for appends before the
    few live bodies that keep it may be moved (compaction): most bodies of a busy link are
    acknowledged sooner."""
    send_window: int = 2000
    """Messages handed to one link and not yet acknowledged, at most, before a message
    SENT since the link opened waits (and the applications SENDing to the link are held):
    what a message just SENT may wait behind in the receiver."""
    backlog_send_window: int = 8000
    """The same bound for a message paged in from a backlog (at least ``send_window``):
    enough to keep the receiver busy over the round trip of its commits and
    acknowledgements. A link with a longer round trip than loopback's needs more."""
    send_window_mb: int = 32
    """MB of messages handed to one link and not yet acknowledged, at most (one message
    always goes, however large)."""
    send_key_window: float = 86400.0
    """Seconds a SEND's idempotency key is kept with its sequence number, and a BEGIN
    DIALOG's with its dialog (each at most as long as its conversation): one retried with
    the same key within it is answered with the first one's number, or dialog, and
    committed once."""
    closed_endpoint_keep: float = 1800.0
    """Seconds a target keeps a closed (``CD``) endpoint, counted from its close or from the
    last copy of one of its messages that arrived since, before it is removed from memory
    and from its file (SPEC §5, Decision): while kept, a late copy of the initiator's
    messages is acknowledged again and not delivered. An initiator's closed endpoint goes
    as soon as its last acknowledgement has been sent."""
    client_pending_mb: int = 16
    """MB of request bodies one client connection may have awaiting their replies (SENDs
    waiting for their commit); beyond it the broker stops reading that connection until
    replies bring it under half (the application's sends then wait in its own socket)."""
    mirror_pairs: int = 1024
    """Mirrored pairs (a mirrored route's two partners, for one service and broker
    instance) whose principal this instance tracks (R-ROUTE-10); past it the pair used
    longest ago is forgotten, counted and logged, and asks both partners again when it is
    used again. A forwarder's mirrored route to every service tracks one pair per service
    its peers' messages name."""
    partial_messages: int = 10_000
    """Messages of several fragments of which some, not all, have arrived (partial,
    status 2, R-DLG-7) that one database holds at once, from all its peers together.
    Past it, the first fragment of another such message is dropped, not stored nor
    acknowledged (its sender sends it again), counted (``partial_refusals``) and named
    in the ``drops`` view; fragments of the messages already held are still taken, so
    they complete and make room. The default is above what an honest sender has in
    flight on one link (``backlog_send_window``)."""
    route_requests: int = 100
    """MissingRoute requests to the dynamic routing service (R-ROUTE-14) pending at once
    for one database's route table (msdb's for messages from outside); a conversation
    that would ask beyond it stays DELAYED and asks when it is routed again, a message
    from outside is dropped, not acknowledged (its sender retries)."""


@dataclass(frozen=True)
class TraceConfig:
    """Delivery traces (``[trace]``): append-only JSON Lines segments, see docs/traces.md."""

    enabled: bool = True
    directory: Path | None = None
    """Where segments go; default ``<data_dir>/traces``."""
    segment_mb: int = 64
    """A segment is closed when it reaches this size (MB) ..."""
    segment_seconds: float = 300.0
    """... or this age, whichever comes first."""
    sample: float = 1.0
    """Fraction of conversations traced (chosen by conversation id, so whole conversations)."""
    flush_interval: float = 0.2
    """Buffered events are written at least this often (seconds)."""
    durable: bool = True
    """Events are fsynced before a commit's outcome reaches the application (a SEND's,
    RECEIVE's or COMMIT's reply waits for them); false: written every
    ``flush_interval``, not fsynced (docs/traces.md "Durability")."""
    compress: bool = True
    """Closed segments are compacted into Parquet (``.parquet``) in the background, by a
    process of lower priority (docs/traces.md, Compaction)."""
    max_total_mb: int = 4096
    """Retention: the oldest closed segments are deleted while this instance's segments
    take more (MB), never its newest; 0: no limit by size."""
    max_age_hours: int = 168
    """Retention: closed segments last written longer ago are deleted; 0: no limit by age."""


ANY_NAME = "*"
"""``[admin] names = ["*"]``: the admin port answers any ``Host``."""


@dataclass(frozen=True)
class AdminConfig:
    """The admin HTTP port (``[admin] listen``): health, Prometheus metrics and the
    read-only web console. ``host`` None: off."""

    host: str | None = None
    port: int = 8022
    names: tuple[str, ...] = ()
    """``[admin] names``: the names, besides an IP address, ``localhost``, the name it
    listens on and this machine's host names, that a request's ``Host`` may give (lower
    case); ``("*",)``: any name."""

    @property
    def any_name(self) -> bool:
        """Whether the port answers a request naming any host (``names = ["*"]``)."""
        return ANY_NAME in self.names

    @property
    def enabled(self) -> bool:
        return self.host is not None

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 hosts in brackets); meaningful only when enabled."""
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class BrokerConfig:
    """The whole file. ``databases`` always holds one named ``msdb``."""

    path: Path
    data_dir: Path
    endpoint: EndpointConfig
    retry: RetryConfig
    client: ClientConfig
    limits: LimitsConfig
    databases: tuple[DatabaseConfig, ...]
    trace: TraceConfig = TraceConfig()
    admin: AdminConfig = AdminConfig()

    def database(self, name: str) -> DatabaseConfig:
        """The database named exactly ``name``; KeyError if there is none."""
        for db in self.databases:
            if db.name == name:
                return db
        raise KeyError(name)
