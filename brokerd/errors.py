"""The daemon's errors, all under the one root ``protocol.errors.BrokerError``.

* :class:`ConfigError`: a configuration file is wrong; the message names the file,
  the key and the problem, and start-up stops.
* :class:`StoreError`: a database file cannot be opened, written or is of another
  schema (a full disk lands here); an application sees it as ``StorageFailure``.
* :class:`AnalyticsError`: ``brokerd analyze`` cannot read a trace set (no
  segments, a directory that does not exist) or Spark cannot start; the Spark cluster
  tool cannot start a cluster or finds none to stop.
* :class:`ClusterError`: ``brokerd cluster`` cannot bring the local cluster up
  (a broker that does not start or become ready, a cluster already up) or down.
* :class:`TraceNotFound`: ``brokerctl trace`` has nothing to show (no segments, a
  conversation or message the traces do not hold, an id that is not a UUID).
* The errors an application sees (``DialogError``, ``ConversationEnded``,
  ``QueueDisabled``, ... each with its wire code) live in ``protocol.errors``,
  because the SDK imports only ``protocol/``; they are re-exported here.
"""

from __future__ import annotations

from protocol.errors import (
    AuthenticationFailed,
    BrokerError,
    ClientError,
    ContractViolation,
    ConversationEnded,
    ConversationNotFound,
    ConversationQuarantined,
    DatabaseNotFound,
    DialogError,
    DialogSecurityUnavailable,
    InvalidErrorCode,
    InvalidRequest,
    KeyReused,
    LockConflict,
    MessageTooLarge,
    NotPrincipal,
    NotQuarantined,
    QueueDisabled,
    QueueNotFound,
    RemoteError,
    RouteInvalid,
    ServiceNotFound,
    SystemMessageType,
    TransactionError,
    TransactionRolledBack,
    ValidationFailed,
)

__all__ = [
    "AnalyticsError",
    "AuthenticationFailed",
    "BrokerError",
    "ClientError",
    "ClusterError",
    "ConfigError",
    "ContractViolation",
    "ConversationEnded",
    "ConversationNotFound",
    "ConversationQuarantined",
    "DatabaseNotFound",
    "DialogError",
    "DialogSecurityUnavailable",
    "InvalidErrorCode",
    "InvalidRequest",
    "KeyReused",
    "LockConflict",
    "MessageTooLarge",
    "NotPrincipal",
    "NotQuarantined",
    "QueueDisabled",
    "QueueNotFound",
    "RemoteError",
    "RouteInvalid",
    "ServiceNotFound",
    "StoreError",
    "SystemMessageType",
    "TransactionError",
    "TransactionRolledBack",
    "ValidationFailed",
]


class ConfigError(BrokerError):
    """A configuration file is invalid: ``"FILE: KEY: problem"``."""

    def __init__(self, path: object, key: str, problem: str) -> None:
        self.path = str(path)
        self.key = key
        self.problem = problem
        where = f"{self.path}: {key}: " if key else f"{self.path}: "
        super().__init__(where + problem)


class StoreError(BrokerError):
    """A database file cannot be used (unreadable, another schema, disk full)."""


class AnalyticsError(BrokerError):
    """The trace analytics cannot run: no trace segments, an unreadable path, no Spark."""


class ClusterError(BrokerError):
    """``brokerd cluster``: a broker did not start or become ready in time (the others
    were stopped again), the directory's cluster is already up, or one did not stop."""


class TraceNotFound(BrokerError):
    """``brokerctl trace`` has nothing to show: no trace segments where it was told to
    look, no event of the conversation, no such message, or an id that is not one."""
