"""Who a client is and what it may do: the client tokens and their roles (R-CLIENT-2).

The admin token (``[client] token_file``, created on first start) and each
``[[client.token]]`` are shared secrets; a client proves it holds one with an HMAC
over the listener's nonce (``protocol.client_wire``) and its login name selects
which: a name listed in ``[[client.token]]`` selects that token, any other name the
admin token. An ``admin`` may do everything. An ``application`` may use only its
own services (BEGIN DIALOG from them, and SEND, END CONVERSATION, timers, MOVE and the
release or end of a quarantine, SPEC §6, on their conversations) and RECEIVE and GET
CONVERSATION GROUP only from its own queues; every admin operation (views, routes,
ALTER QUEUE, EXPLAIN, mirror roles) is refused with
:class:`~protocol.errors.PermissionDenied`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from brokerd.config import ClientConfig
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.directories import make_directory, sync_directory
from brokerd.errors import ConfigError
from protocol.errors import PermissionDenied

ADMIN_OPERATIONS = frozenset(
    {
        "alter_queue",
        "create_route",
        "alter_route",
        "drop_route",
        "explain",
        "set_mirror_role",
        "view",
    }
)
"""Operations only an admin token may ask for."""


def load_or_create_token(path: Path, config_path: Path | None = None, key: str = "") -> bytes:
    """A client token's secret; created (mode 0600) on first start. A file that cannot be
    read, is not text or is empty is a ConfigError naming ``key`` (R-CLIENT-1: an empty
    secret would let anyone log in)."""
    try:
        if not path.exists():
            make_directory(path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
                f.flush()
                os.fsync(f.fileno())  # the clients given it find it after a power loss
            sync_directory(path.parent)
        secret = path.read_text().strip().encode()
    except UnicodeDecodeError:
        raise ConfigError(config_path, key, f"file {path} is not a token (not text)") from None
    except OSError as exc:
        raise ConfigError(config_path, key, f"cannot read {path}: {exc}") from exc
    if not secret:
        raise ConfigError(config_path, key, f"file {path} is empty: a token is required")
    return secret


@dataclass(frozen=True)
class Access:
    """What one logged-in client may do."""

    name: str
    role: str
    services: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def check_operation(self, op: str) -> None:
        if not self.admin and op in ADMIN_OPERATIONS:
            raise PermissionDenied(
                f"{op} is an admin operation; the application token {self.name!r} may not ask "
                "for it"
            )

    def check_service(self, service: str) -> None:
        if not self.admin and service not in self.services:
            raise PermissionDenied(
                f"service {service!r} is not one of the application token {self.name!r}'s "
                f"services ({', '.join(sorted(self.services)) or 'none'})"
            )

    def check_conversation(self, ep: Endpoint) -> None:
        if not self.admin and ep.service not in self.services:
            raise PermissionDenied(
                f"conversation {ep.handle} belongs to service {ep.service!r}, which is not one "
                f"of the application token {self.name!r}'s services"
            )

    def check_queue(self, queue: str) -> None:
        if not self.admin and queue not in self.queues:
            raise PermissionDenied(
                f"queue {queue!r} is not one of the application token {self.name!r}'s queues "
                f"({', '.join(sorted(self.queues)) or 'none'})"
            )


class Credentials:
    """The tokens of one daemon, read (and created where missing) at start-up."""

    def __init__(self, config: ClientConfig, config_path: Path | None = None) -> None:
        self.admin_token = load_or_create_token(config.token_file, config_path, "client.token_file")
        self.named: dict[str, tuple[bytes, Access]] = {}
        for n, token in enumerate(config.tokens):
            key = f"client.token[{n}].file"
            secret = load_or_create_token(token.file, config_path, key)
            if secret == self.admin_token and token.role != "admin":
                # R-CLIENT-2: any other login name selects the admin token, so an
                # application holding the admin's secret would be an admin
                raise ConfigError(
                    config_path,
                    key,
                    f"token {token.name!r} has the secret of client.token_file (the admin "
                    "token): give each token a secret of its own",
                )
            access = Access(
                token.name, token.role, frozenset(token.services), frozenset(token.queues)
            )
            self.named[token.name] = (secret, access)

    def select(self, user: str) -> tuple[bytes, Access]:
        """The secret the login name ``user`` must prove, and what it may then do."""
        named = self.named.get(user)
        if named is not None:
            return named
        return self.admin_token, Access(user, "admin")
