"""The soak's checker (brokerd/tools/soak/checker.py) on ledgers written here: it must
see every kind of violation of exactly once in order (SPEC R-DLG-1), and resolve a
batch whose consumer died before learning the COMMIT's outcome."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from brokerd.tools.soak import checker
from brokerd.tools.soak.checker import check
from brokerd.tools.soak.records import Ledger, make_body, parse_body

REPLY_EVERY = 0


def ledgers(tmp_path: Path, sent: str, received: str) -> Path:
    (tmp_path / "sent-ab0.log").write_text(sent)
    (tmp_path / "received-b.log").write_text(received)
    return tmp_path


def sent(*indexes: int, key: str = "k") -> str:
    return "".join(f"T {key} {i}\nC {key} {i}\n" for i in indexes)


def counts(tmp_path: Path, received: str, sent_text: str | None = None) -> dict[str, int]:
    ledgers(tmp_path, sent(0, 1, 2) if sent_text is None else sent_text, received)
    verdict = check(tmp_path, REPLY_EVERY)
    return {k: len(v) for k, v in verdict.violations.items() if v}


def test_a_clean_run(tmp_path: Path) -> None:
    received = "R 1.1 k 0 1\nR 1.1 k 1 1\nK 1.1\nR 1.2 k 2 1\nK 1.2\n"
    assert counts(tmp_path, received) == {}


def test_loss_duplicate_reorder_corrupt(tmp_path: Path) -> None:
    assert counts(tmp_path, "R 1.1 k 0 1\nR 1.1 k 1 1\nK 1.1\n") == {"loss": 1}
    received = "R 1.1 k 0 1\nR 1.1 k 1 1\nK 1.1\nR 1.2 k 1 1\nR 1.2 k 2 1\nK 1.2\n"
    assert counts(tmp_path, received) == {"duplicate": 1}
    received = "R 1.1 k 0 1\nR 1.1 k 2 1\nK 1.1\nR 1.2 k 1 1\nK 1.2\n"
    assert counts(tmp_path, received) == {"reorder": 1}
    received = "R 1.1 k 0 1\nR 1.1 k 1 0\nR 1.1 k 2 1\nK 1.1\n"
    assert counts(tmp_path, received) == {"corrupt": 1}


def test_phantoms_and_dialog_errors(tmp_path: Path) -> None:
    received = "R 1.1 k 0 1\nR 1.1 k 1 1\nR 1.1 k 2 1\nR 1.1 other 0 1\nK 1.1\n"
    assert counts(tmp_path, received) == {"phantom": 1}
    refused = sent(0, 1) + "T k 2\nF k 2\n"
    received = "R 1.1 k 0 1\nR 1.1 k 1 1\nR 1.1 k 2 1\nK 1.1\n"
    assert counts(tmp_path, received, refused) == {"phantom": 1}
    received = "R 1.1 k 0 1\nR 1.1 k 1 1\nR 1.1 k 2 1\nX 1.1 unparseable 12\nK 1.1\n"
    assert counts(tmp_path, received) == {"phantom": 1}
    received = "R 1.1 k 0 1\nR 1.1 k 1 1\nR 1.1 k 2 1\nX 1.1 Error 8 gone\nK 1.1\n"
    assert counts(tmp_path, received) == {"dialog_error": 1}


def test_a_message_on_another_conversation_is_misdelivered(tmp_path: Path) -> None:
    """Each key is one dialog: its messages come on one conversation handle, whichever
    consumer takes them; one received on another is a violation (R-DLG-1)."""
    one, other = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    received = f"R 1.1 k 0 1 {one}\nR 1.1 k 1 1 {one}\nK 1.1\nR 1.2 k 2 1 {other}\nK 1.2\n"
    assert counts(tmp_path, received) == {"misdelivered": 1}
    same = f"R 1.1 k 0 1 {one}\nR 1.1 k 1 1 {one}\nK 1.1\nR 1.2 k 2 1 {one}\nK 1.2\n"
    assert counts(tmp_path, same) == {}
    torn = f"R 1.1 k 0 1 {one}\nR 1.1 k 1 1 {one}\nK 1.1\nR 1.2 k 2 1 {one}\nK 1.2\nR 1.3 k 3 1 c"
    assert counts(tmp_path, torn) == {}  # a last line cut short is not read


def test_an_uncertain_send_may_arrive_once_or_not_at_all(tmp_path: Path) -> None:
    text = sent(0) + "T k 1\n" + sent(2)
    assert counts(tmp_path, "R 1.1 k 0 1\nR 1.1 k 2 1\nK 1.1\n", text) == {}
    assert counts(tmp_path, "R 1.1 k 0 1\nR 1.1 k 1 1\nR 1.1 k 2 1\nK 1.1\n", text) == {}


def test_batches_rolled_back_or_left_without_outcome(tmp_path: Path) -> None:
    # Rolled back on purpose, then received again: counted once.
    received = "R 1.1 k 0 1\nA 1.1\nR 1.2 k 0 1\nR 1.2 k 1 1\nR 1.2 k 2 1\nK 1.2\n"
    assert counts(tmp_path, received) == {}
    # The consumer died after its records: received again later, so it rolled back.
    received = "R 1.1 k 0 1\nR 2.1 k 0 1\nR 2.1 k 1 1\nR 2.1 k 2 1\nK 2.1\n"
    assert counts(tmp_path, received) == {}
    # Not received again: its COMMIT, asked for (P), took effect before the consumer died.
    received = "R 1.1 k 0 1\nP 1.1\nR 2.1 k 1 1\nR 2.1 k 2 1\nP 2.1\nK 2.1\n"
    assert counts(tmp_path, received) == {}
    assert check(tmp_path, REPLY_EVERY).batches == {"committed (resolved)": 1, "committed": 1}


def test_replies_sent_in_a_committed_batch_must_arrive(tmp_path: Path) -> None:
    (tmp_path / "sent-ab0.log").write_text(sent(0, 1, 2))
    (tmp_path / "received-b.log").write_text("R 1.1 k 0 1\nR 1.1 k 1 1\nR 1.1 k 2 1\nK 1.1\n")
    (tmp_path / "received-a.log").write_text("R 1.1 k~r 0 1\nK 1.1\nR 1.2 k~r 3 1\nK 1.2\n")
    verdict = check(tmp_path, reply_every=2)
    assert verdict.replies_expected == 2
    assert verdict.violations["loss"] == ["k~r #2"]
    assert verdict.violations["phantom"] == ["reply k~r #3 to a request never received"]


def test_bodies_carry_their_checksum() -> None:
    body = make_body("ab0.1", 7, 1000, random.Random(1))
    parsed = parse_body(body)
    assert parsed is not None and (parsed.key, parsed.index, parsed.intact) == ("ab0.1", 7, True)
    broken = bytearray(body)
    broken[-10] ^= 0xFF
    assert parse_body(bytes(broken)) == parsed.__class__("ab0.1", 7, False)
    truncated = parse_body(body[:-1])
    assert truncated is not None and not truncated.intact
    assert parse_body(b"not a soak body") is None


def test_the_local_stream_is_counted_apart(tmp_path: Path) -> None:
    """The dialogs inside one database of A (keys ``ll...``, direct delivery, R-DLG-13)
    are judged like the others and counted apart, violations included."""
    (tmp_path / "sent-ab0.log").write_text(sent(0, 1, key="ab0.1"))
    (tmp_path / "sent-ll0.log").write_text(sent(0, 1, 2, key="ll0.1") + "T ll0.1 3\n")
    (tmp_path / "received-b.log").write_text("R 1.1 ab0.1 0 1\nR 1.1 ab0.1 1 1\nK 1.1\n")
    received = "R 2.1 ll0.1 0 1\nR 2.1 ll0.1 2 1\nK 2.1\nR 2.2 ll0.1 1 1\nK 2.2\n"
    (tmp_path / "received-l2.log").write_text(received + "X 2.3 Error 8 gone\nK 2.3\n")
    verdict = check(tmp_path, REPLY_EVERY)
    assert {k: len(v) for k, v in verdict.violations.items() if v} == {
        "reorder": 1,
        "dialog_error": 1,
    }
    assert verdict.streams["local"] == {
        "committed_sends": 3,
        "uncertain_sends": 1,
        "refused_sends": 0,
        "received": 3,
        "replies_expected": 0,
        "violations": 2,
    }
    assert verdict.streams["remote"]["received"] == 2
    assert verdict.streams["remote"]["violations"] == 0


def test_a_record_after_a_torn_line_is_read(tmp_path: Path) -> None:
    """A consumer SIGKILLed in the middle of a write leaves its last line cut short; the
    next consumer's records start on a line of their own and count. (The short soak
    once glued ``R`` and the next record into ``RR ...``: a reception the checker could
    not read, reported as a loss and a phantom reply.)"""
    path = tmp_path / "received-b.log"
    first = Ledger(path, sync=True)
    first.write(["R 1.1 ab0.1 0 1", "K 1.1", "R 1.2 ab0.1 1 1"])
    first.close()
    with path.open("a") as f:
        f.write("R 1.2 ab0.1 2")  # cut short: no flag, no newline
    again = Ledger(path, sync=True)
    again.write(["R 2.1 ab0.1 1 1", "R 2.1 ab0.1 2 1", "K 2.1"])
    again.close()
    lines = path.read_text().splitlines()
    assert lines[-4:] == ["R 1.2 ab0.1 2", "R 2.1 ab0.1 1 1", "R 2.1 ab0.1 2 1", "K 2.1"]
    batches = checker._batches(path)
    assert [(b.state, [(k, i) for k, i, _, _ in b.records]) for b in batches] == [
        ("committed", [("ab0.1", 0)]),
        ("rolled back", [("ab0.1", 1)]),
        ("committed", [("ab0.1", 1), ("ab0.1", 2)]),
    ]
    unchanged = Ledger(path, sync=False)  # a file ending in a newline gets none more
    unchanged.close()
    assert path.read_text().endswith("K 2.1\n") and "\n\n" not in path.read_text()
