"""The project's one error tree.

Every error brokerd raises on purpose derives from :class:`BrokerError`. The
protocol layer splits its own failures the way h11 does:

* :class:`LocalProtocolError`: *we* asked for something illegal (sending before
  the handshake finished, a value that does not fit its field). A bug on our side.
* :class:`RemoteProtocolError`: the *peer* sent something illegal (bad magic, a
  frame over the size limit, an untrusted certificate). Raised by the
  connection, it means the connection is dead and ``close_code`` says what was
  told to the peer; raised by a dialog codec (``protocol/dialog.py``) over an
  authenticated payload, it concerns that one payload and the caller decides.

construct's own exceptions never leave ``protocol/``: the codecs wrap them.
Later layers (configuration, store, dialogs, SDK) add their subclasses of
:class:`BrokerError` next to their code, all under this one root.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar


class CloseCode(enum.IntEnum):
    """Why a connection is closed or refused; carried in CLOSE frames."""

    NORMAL = 0
    IDLE = 1
    SHUTDOWN = 2
    PROTOCOL_ERROR = 10
    FRAME_TOO_LARGE = 11
    VERSION_MISMATCH = 12
    UNTRUSTED_CERTIFICATE = 13
    AUTHENTICATION_FAILED = 14
    ENCRYPTION_MISMATCH = 15
    PEER_NAME_MISMATCH = 16
    INTEGRITY = 17


class BrokerError(Exception):
    """Root of every error brokerd raises deliberately."""

    retriable: bool = False
    """True when the same request may succeed later without any change."""


class ProtocolError(BrokerError):
    """A wire-protocol failure (adjacent-broker or dialog layer)."""


class LocalProtocolError(ProtocolError):
    """This side tried to do something the protocol forbids."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids; the connection cannot go on."""

    def __init__(self, message: str, close_code: CloseCode = CloseCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.events: list[Any] = []
        """Events decoded, in the same receive_data call, before the failure."""


class HandshakeRefused(RemoteProtocolError):
    """This side refused the peer during the handshake (certificate, proof, mode, version)."""


class ReassemblyError(ProtocolError):
    """Fragments that cannot belong to one message, or a message over the size limit."""


class ReassemblyFull(ReassemblyError):
    """The reassembler's memory bounds are reached; refuse the fragment unacknowledged."""

    retriable = True


class ClientError(BrokerError):
    """The SDK's connection to a daemon failed or was closed."""

    retriable = True


class AuthenticationFailed(ClientError):
    """The daemon's client listener refused the credentials."""

    retriable = False


class OutcomeUnknown(ClientError):
    """The connection was lost after the request was written and before its answer came:
    it may or may not have taken effect. (A daemon that stops with SIGTERM answers what
    it read and says what it did not read, :class:`BrokerStopping`; this is a crash, a
    kill or a lost network.)"""


class NotConnected(ClientError):
    """The SDK had no connection to the daemon and got none in time (or the client was
    closed): the request was never sent, so nothing of it took effect."""


class TransactionLost(ClientError):
    """The connection a client transaction lived on was lost: the daemon rolled the
    transaction back, and nothing of it took effect. Begin a new one. (A COMMIT written
    before the loss and never answered is :class:`OutcomeUnknown` instead.)"""

    retriable = True


class RemoteError(BrokerError):
    """A request the daemon refused, as the application sees it.

    The daemon raises these classes and the client listener sends their
    :attr:`code`; the SDK raises the same class again (:func:`for_code`), so an
    application catches ``ConversationEnded`` or ``QueueDisabled`` by type, as
    aiokafka's errors are caught. ``kind`` is the class name the daemon sent.
    An unknown code arrives as this base class.
    """

    code: ClassVar[str] = "refused"

    def __init__(self, message: str, *, kind: str | None = None, retriable: bool | None = None):
        self.kind = kind or type(self).__name__
        super().__init__(message if kind is None else f"{self.kind}: {message}")
        self.remote_message = message
        if retriable is not None:
            self.retriable = retriable


class InvalidRequest(RemoteError):
    """The request itself is malformed: a missing or ill-typed field, an unknown operation."""

    code = "invalid_request"


class InvalidErrorCode(InvalidRequest):
    """END CONVERSATION WITH ERROR with a code of 0 or less: those are the broker's own
    (SPEC §6)."""

    code = "invalid_error_code"


class KeyReused(InvalidRequest):
    """BEGIN DIALOG with an idempotency key its initiating service already gave a dialog
    begun with other arguments (another target service, contract, lifetime, ...): a key
    names one dialog (SPEC §6, outcomes)."""

    code = "key_reused"


class NotFound(RemoteError):
    """A named object does not exist on this broker."""

    code = "not_found"


class DatabaseNotFound(NotFound):
    """No database of this name on this broker."""

    code = "database_not_found"


class ServiceNotFound(NotFound):
    """The named service does not exist in the database."""

    code = "service_not_found"


class QueueNotFound(NotFound):
    """No queue of this name in the database (or it exists in several: name the database)."""

    code = "queue_not_found"


class ConversationNotFound(NotFound):
    """No conversation endpoint with this handle (never begun, or cleaned up)."""

    code = "conversation_not_found"


class DialogError(RemoteError):
    """An application verb on a conversation was refused."""

    code = "dialog_refused"


class ConversationEnded(DialogError):
    """The conversation is closed, in error, or ended by one side: no more SENDs (SPEC §5)."""

    code = "conversation_ended"


class ContractViolation(DialogError):
    """The contract does not allow this message type from this side (R-DLG-3), or the
    service does not accept the contract."""

    code = "contract_violation"


class SystemMessageType(ContractViolation):
    """SEND of a message type the broker reserves for itself (EndDialog, Error,
    DialogTimer): no contract holds them (SPEC §6)."""

    code = "system_message_type"


class ValidationFailed(DialogError):
    """The body fails its message type's validation (R-OBJ-1)."""

    code = "validation_failed"


class MessageTooLarge(DialogError):
    """The body exceeds the broker's ``max_message_size``."""

    code = "message_too_large"


class NotPrincipal(DialogError):
    """The database is the mirror partner; work on the principal (R-ROUTE-10)."""

    code = "not_principal"
    retriable = True


class DialogSecurityUnavailable(DialogError):
    """BEGIN DIALOG of a dialog that must be secured (the service requires dialog security,
    or the target service has a remote service binding) without what it needs: the
    initiating service's key pair, or a remote service binding for the target (R-DLG-14)."""

    code = "dialog_security_unavailable"


class QueueDisabled(DialogError):
    """RECEIVE on a queue whose status is off (R-DLG-12)."""

    code = "queue_disabled"
    retriable = True


class ConversationQuarantined(DialogError):
    """RECEIVE naming a conversation that poison-message handling quarantined (SPEC §6):
    its messages are set aside until an administrator releases it or ends it."""

    code = "conversation_quarantined"
    retriable = False


class NotQuarantined(DialogError):
    """Release or end-with-error of a conversation that is not quarantined (SPEC §6)."""

    code = "not_quarantined"
    retriable = False


class LockConflict(DialogError):
    """The conversation group is locked by another transaction."""

    code = "lock_conflict"
    retriable = True


class TransactionError(RemoteError):
    """A client transaction cannot go on: unknown, already finished, or spanning databases."""

    code = "transaction_invalid"


class TransactionRolledBack(TransactionError):
    """COMMIT failed; nothing of the transaction took effect."""

    code = "transaction_rolled_back"


class RouteInvalid(RemoteError):
    """A route administration request was refused (R-OBJ-5, R-OBJ-6)."""

    code = "route_invalid"


class PermissionDenied(RemoteError):
    """The client's token does not allow this: an application token asked for an admin
    operation, or for a service, queue or conversation that is not its own."""

    code = "permission_denied"


class StorageFailure(RemoteError):
    """The daemon could not commit (a full disk, an unwritable file); nothing took effect."""

    code = "storage_failure"


class BrokerStopping(RemoteError):
    """The daemon is stopping and did not read this request: it was not executed, and may
    be sent again, to this daemon once it is back or to another. Every request it did read
    was answered before it closed the connection."""

    code = "broker_stopping"
    retriable = True


class InternalError(RemoteError):
    """The daemon failed unexpectedly while handling the request (its log has the details)."""

    code = "internal_error"


def _registry() -> dict[str, type[RemoteError]]:
    found: dict[str, type[RemoteError]] = {}
    pending: list[type[RemoteError]] = [RemoteError]
    while pending:
        cls = pending.pop()
        found[cls.code] = cls
        pending.extend(cls.__subclasses__())
    return found


_BY_CODE = _registry()


def for_code(code: object) -> type[RemoteError]:
    """The error class of a code sent by the daemon; :class:`RemoteError` if unknown."""
    return _BY_CODE.get(code, RemoteError) if isinstance(code, str) else RemoteError


def error_codes() -> dict[str, type[RemoteError]]:
    """Every code the daemon may send, with its class (docs/errors.md lists them)."""
    return dict(_BY_CODE)
