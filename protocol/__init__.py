"""brokerd's wire protocols, sans-I/O: codecs and state machines, bytes in and events out.

Modules:
  errors      the project's error tree (BrokerError and the protocol errors)
  codec       construct helpers: derived fast structs, wrapped parse/build
  frames      adjacent-broker frame format (header + bodies), declared with construct
  security    identities, certificate checks, key schedule, fragment protection
  digests     the MD5 signatures of several frames at once (SIMD lanes of the compiled
              _md5lanes, built from _md5lanes.c; hashlib without it)
  events      connection events
  session     a connection's numbered frames: clear ones, then sealed and opened under
              the session keys
  handshake   the four-message handshake: peer authentication, version and encryption,
              the session keys
  connection  the adjacent-broker connection state machine (frames off the stream,
              which may come when, events in and out)
  liveness    heartbeats and the silence deadline of an open connection
  dialog      dialog-protocol message header codec
  dialog_security  dialog keys: key exchange, sealing and opening of secured dialogs
  fragments   fragmenter and reassembler
  client_wire SDK <-> daemon client-listener frame format, its reader and auth proof
  mirroring   database mirroring messages (units of work, snapshots, confirmations)

Nothing here imports asyncio, sockets, sqlite or reads a clock; a test enforces it.
"""

from protocol.client_wire import ClientFrame, ClientFrameKind, ClientFrameReader
from protocol.connection import BrokerConnection, ConnectionSettings, Role, State
from protocol.errors import (
    BrokerError,
    CloseCode,
    HandshakeRefused,
    LocalProtocolError,
    ProtocolError,
    ReassemblyError,
    ReassemblyFull,
    RemoteProtocolError,
)
from protocol.frames import EncryptionMode, MirrorRole
from protocol.security import Identity

__all__ = [
    "BrokerConnection",
    "BrokerError",
    "ClientFrame",
    "ClientFrameKind",
    "ClientFrameReader",
    "CloseCode",
    "ConnectionSettings",
    "EncryptionMode",
    "HandshakeRefused",
    "Identity",
    "LocalProtocolError",
    "MirrorRole",
    "ProtocolError",
    "ReassemblyError",
    "ReassemblyFull",
    "RemoteProtocolError",
    "Role",
    "State",
]
