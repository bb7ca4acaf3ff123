"""Whether what arrives is let in, and the broker errors that answer a refusal.

Owns the checks a fragment or acknowledgement from a link passes before it is applied:

* R-DLG-14: what arrives for an existing endpoint must come from the far side it is
  bound to (:mod:`~brokerd.dialogs.endpoints.binding`), and a secured dialog's frames
  must open under its dialog key (:mod:`protocol.dialog_security`); the target of a
  secured dialog takes the key from the first message's key exchange. What fails is
  dropped, counted and never acknowledged or applied;
* the receiver's own checks of a message: its size, the contract (R-DLG-3) and the
  message type's validation (R-OBJ-1);
* whether a message for a conversation that has no endpoint here may begin one (SPEC
  §5: a closed endpoint removed is not begun again by a late copy);
* the unsequenced broker Error that answers a refused message (R-DLG-2); nothing of
  it is stored.

May import: ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints`` and what
they may import.
"""

from __future__ import annotations

from collections.abc import Callable

from brokerd.dialogs.endpoints import binding
from brokerd.dialogs.endpoints.broker_errors import (
    CODE_CONVERSATION_NOT_FOUND,
    CODE_DIALOG_SECURITY,
    CODE_MESSAGE_TOO_LARGE,
    CODE_MESSAGE_TYPE_REFUSED,
    CODE_VALIDATION_FAILED,
    error_body,
)
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.transmission.links import Link
from brokerd.dialogs.transmission.transmission import Transmission
from protocol.buffers import Body
from protocol.dialog import ERROR, FLAG_ERROR, FLAG_INITIATOR, DialogHeader
from protocol.dialog_security import DialogKeys, DialogSecurityError, open_key_exchange

FIRST_SEQUENCE = 1
"""The sequence number of a dialog's first message (a SEND numbers from 1)."""


class Admission:
    """The checks of what arrives, and the broker errors that refuse it."""

    def __init__(
        self,
        directory: Directory,
        events: DialogEvents,
        transmission: Transmission,
        stats: EngineStats,
        max_message_size: int,
        keep: float,
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.events = events
        self.transmission = transmission
        self.stats = stats
        self.max_message_size = max_message_size
        self.keep = keep
        """Seconds a target keeps a closed endpoint (``limits.closed_endpoint_keep``): a
        secured dialog's first message is taken only with a key exchange younger than
        that (R-DLG-14)."""
        self.clock = clock
        """Wall-clock time, as the initiators' exchanges carry it."""

    def refused(self, link: Link, ep: Endpoint, header: DialogHeader, what: str) -> bool:
        """R-DLG-14: drop (never acknowledge or apply) what does not come from the far side
        ``ep`` is bound to."""
        reason = binding.refusal(ep, header, link.identity)
        if reason is None:
            return False
        self.stats.binding_refusals += 1
        self.events.drop(header, f"{what} refused: {reason}")
        return True

    def opened(self, ep: Endpoint, header: DialogHeader, body: bytes, what: str) -> bytes | None:
        """Dialog security (R-DLG-14): the plaintext of what arrived for ``ep``, or None if
        it is refused (dropped, counted, never acknowledged or applied)."""
        keys = ep.keys
        reason = None
        if keys is None:
            if header.security is None:
                return body
            reason = "a secured frame for a dialog that is not secured"
        elif header.security is None:
            if (
                header.flags & FLAG_ERROR
                and not header.sequenced
                and ep.initiator
                and not ep.key_confirmed
            ):
                return body  # the target could not take the secured dialog: its broker error
            reason = "the dialog is secured, but this frame is not"
        else:
            try:
                plain = keys.open(header, body)
            except DialogSecurityError as exc:
                reason = str(exc)
            else:
                if ep.initiator:
                    ep.key_confirmed = True
                return plain
        self.stats.dialog_security_refusals += 1
        self.events.drop(header, f"{what} refused by dialog security: {reason} (R-DLG-14)")
        return None

    def refusal(
        self, db: Database, contract: str, header: DialogHeader, body: bytes
    ) -> tuple[int, str] | None:
        """Why the receiver refuses this message (R-OBJ-1, R-DLG-3, size), as (code, text)."""
        return self.refusal_of(
            db,
            contract,
            header.message_type,
            header.initiator,
            header.message_length,
            header.fragment_count,
            body,
        )

    def refusal_of(
        self,
        db: Database,
        contract: str,
        message_type: str,
        initiator: bool,
        length: int,
        fragments: int,
        body: Body,
    ) -> tuple[int, str] | None:
        """:meth:`refusal` of a message given by its parts (``body``: this fragment's)."""
        if length > self.max_message_size:
            return CODE_MESSAGE_TOO_LARGE, (
                f"message of {length} bytes exceeds this broker's "
                f"max_message_size of {self.max_message_size}"
            )
        catalog = db.catalog
        refusal = catalog.send_refusal(contract, message_type, initiator)
        if refusal:
            return CODE_MESSAGE_TYPE_REFUSED, refusal
        if fragments == 1 or not catalog.needs_whole_body(message_type):
            invalid = catalog.validation_problem(message_type, body)
            if invalid:
                return CODE_VALIDATION_FAILED, invalid
        return None

    def target_keys(
        self, db: Database, link: Link, header: DialogHeader, body: bytes
    ) -> tuple[DialogKeys | None, bytes | None]:
        """R-DLG-14 at the target: the dialog's keys (None: not secured) and the first
        message's plaintext (None: refused). A dialog the target cannot secure is answered
        with a broker error; a key exchange or message that fails its check is dropped
        (the initiator sends it again)."""
        sk = db.service_keys
        sec = header.security
        if sec is None:
            # A dialog with a service bound here is secured whichever side began it: one
            # that claims to come from it unsecured is refused, not taken on its word.
            if sk.secured(header.to_service, header.from_service):
                reason = (
                    f"service {header.to_service!r} requires dialog security"
                    if header.to_service in sk.required
                    else f"service {header.from_service!r} has a remote service binding here"
                )
                self.send_broker_error(
                    link,
                    db,
                    header,
                    CODE_DIALOG_SECURITY,
                    f"{reason}; the dialog is not secured",
                )
                return None, None
            return None, body
        problem = sk.plan(header.to_service, header.from_service)
        if problem is not None:
            self.send_broker_error(
                link,
                db,
                header,
                CODE_DIALOG_SECURITY,
                f"the dialog is secured, but the target cannot take it: {problem}",
            )
            return None, None
        try:
            if not sec.key_exchange:
                raise DialogSecurityError("the first message carries no key exchange")
            opened = open_key_exchange(
                sec.key_exchange,
                header.conversation_id,
                header.from_service,
                header.to_service,
                sk.own[header.to_service],
                sk.bound[header.from_service],
            )
            age = opened.age(int(self.clock() * 1000))
            if age > self.keep:
                # SPEC §5, R-DLG-4: a target that took this dialog has it still, or removed
                # it at least a keep after its first message came; a first message whose
                # exchange is older may be one recorded and sent again after that removal.
                raise DialogSecurityError(
                    f"the key exchange was made {age:.0f} s ago, longer than this broker "
                    f"keeps a closed endpoint ({self.keep:g} s): it may be a replay of a "
                    "dialog already ended here (the initiator makes its exchange again)"
                )
            keys = DialogKeys(opened.dialog_key)
            return keys, keys.open(header, body)
        except DialogSecurityError as exc:
            self.stats.dialog_security_refusals += 1
            self.events.drop(header, f"message refused by dialog security: {exc} (R-DLG-14)")
            return None, None

    def may_begin(self, link: Link, db: Database, header: DialogHeader) -> bool:
        """Whether a message for a conversation this database holds no endpoint of may
        begin one (SPEC §5, Decision): only the initiator's first message, or an Error
        (it never waits behind the messages before it, R-DLG-10), creates the target's
        endpoint. A later message is a copy for a target endpoint removed after it closed,
        or overtook its dialog's first: dropped, not acknowledged (its sender resends it).
        A message of a target for an initiator endpoint that is gone (removed after it
        closed, or ended WITH CLEANUP) is answered with a broker error, so the target's
        side ends too instead of retrying for ever."""
        if header.initiator and header.sequenced:
            if header.sequence_number == FIRST_SEQUENCE or header.flags & FLAG_ERROR:
                return True
            self.events.drop(
                header,
                "no conversation endpoint for this message, and it is not the first of its "
                "dialog: its target endpoint was removed after it closed, or it overtook "
                "the first (SPEC §5)",
            )
            return False
        if not header.initiator and header.sequenced:
            self.send_broker_error(
                link,
                db,
                header,
                CODE_CONVERSATION_NOT_FOUND,
                f"conversation {header.conversation_id} has no initiator endpoint in "
                f"database {db.name!r}: it was closed and removed, or ended WITH CLEANUP",
            )
            return False
        self.events.drop(header, "no conversation endpoint for this message")
        return False

    def send_broker_error(
        self,
        link: Link,
        db: Database | None,
        header: DialogHeader,
        code: int,
        text: str,
        ep: Endpoint | None = None,
    ) -> None:
        """An unsequenced Error in answer to a refused message (R-DLG-2); nothing is stored."""
        self.stats.broker_errors_sent += 1
        self.events.drop(header, f"refused with broker error {code}: {text}")
        body = error_body(code, text)
        instance = (db or self.directory.msdb).broker_instance
        reply = DialogHeader(
            header.conversation_id,
            header.to_service,
            header.from_service,
            instance,
            header.from_broker_instance,
            header.contract,
            ERROR,
            FLAG_ERROR | (0 if header.initiator else FLAG_INITIATOR),
            0,
            0,
            1,
            0,
            len(body),
        )
        if ep is not None and ep.keys is not None:
            reply, body = self.transmission.seal(ep, reply, body)
        link.queue_header(reply, body)
