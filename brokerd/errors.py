"""The daemon's and the SDK's errors, all under the one root ``protocol.errors.BrokerError``.

* :class:`ConfigError`: a configuration file is wrong; the message names the file,
  the key and the problem, and start-up stops.
* :class:`StoreError`: a database file cannot be opened, written or is of another
  schema (a full disk lands here).
* :class:`DialogError`: an application verb was refused (unknown conversation,
  a message type the contract forbids for this role (R-DLG-3), a closed dialog).
* :class:`ServiceNotFound`, :class:`QueueDisabled`: refusals with their own class
  so that applications can catch them.
* :class:`AnalyticsError`: ``brokerd analyze`` cannot read a trace set (no
  segments, a directory that does not exist) or Spark cannot start.
* :class:`ClientError`, :class:`AuthenticationFailed` and :class:`RemoteError`
  live in ``protocol.errors`` (the SDK imports only ``protocol/``) and are
  re-exported here.
"""

from __future__ import annotations

from protocol.errors import AuthenticationFailed, BrokerError, ClientError, RemoteError

__all__ = [
    "AnalyticsError",
    "AuthenticationFailed",
    "BrokerError",
    "ClientError",
    "ConfigError",
    "DialogError",
    "QueueDisabled",
    "RemoteError",
    "ServiceNotFound",
    "StoreError",
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


class DialogError(BrokerError):
    """An application verb on a conversation was refused."""


class ServiceNotFound(DialogError):
    """The named service does not exist in the database."""


class QueueDisabled(DialogError):
    """RECEIVE on a queue whose status is off."""

    retriable = True


class AnalyticsError(BrokerError):
    """The trace analytics cannot run: no trace segments, an unreadable path, no Spark."""
