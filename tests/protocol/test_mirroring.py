"""Database mirroring messages (SPEC R-ROUTE-16): round trips, golden bytes, bounds.

The golden vectors in tests/protocol/golden/mirroring_v1.json pin the MIRROR frame body
and the encoding of a unit's statements; regenerate only on purpose:
``python -m tests.protocol.test_mirroring --regenerate``.
"""

from __future__ import annotations

import json
import struct
import sys
import uuid
from pathlib import Path

import pytest

from protocol import mirroring
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.events import Mirror
from protocol.mirroring import Attach, Chunk, ChunkAssembler, Confirm, Kind, Refuse
from tests.conftest import Pki, open_pair

GOLDEN = Path(__file__).parent / "golden" / "mirroring_v1.json"
INSTANCE = uuid.UUID("5d0c2b1e-7f43-4a9b-8e21-3c6f0a9d4b72")
STATEMENTS = [
    ("INSERT INTO t VALUES (?, ?, ?, ?, ?)", (None, 7, -1.5, "text", b"\x00\xff")),
    ("DELETE FROM t WHERE a = ?", (2**63 - 1,)),
    ("INSERT INTO t VALUES (?, ?, ?, ?, ?)", (-(2**63), 0, 0.0, "", b"")),
]
MESSAGES: dict[str, mirroring.Message] = {
    "attach": Attach(INSTANCE, 3, 41, 2),
    "unit": Chunk(Kind.UNIT, INSTANCE, 42, 3, True, b"statements"),
    "snapshot_part": Chunk(Kind.SNAPSHOT, INSTANCE, 42, 3, False, b"SQLite format 3\x00"),
    "confirm": Confirm(INSTANCE, 42),
    "refuse": Refuse(INSTANCE, "not principal"),
}


def golden_vectors() -> dict[str, bytes]:
    out = {name: mirroring.encode(message) for name, message in MESSAGES.items()}
    out["statements"] = mirroring.encode_statements(STATEMENTS)
    return out


def test_golden_vectors_match_the_checked_in_bytes() -> None:
    expected = {k: bytes.fromhex(v) for k, v in json.loads(GOLDEN.read_text()).items()}
    assert golden_vectors() == expected


def test_messages_round_trip() -> None:
    for message in MESSAGES.values():
        assert mirroring.decode(mirroring.encode(message)) == message


def test_statements_round_trip_with_texts_stored_once() -> None:
    data = mirroring.encode_statements(STATEMENTS)
    assert mirroring.decode_statements(data) == STATEMENTS
    assert data.count(b"INSERT INTO t") == 1


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x01" + INSTANCE.bytes,  # ATTACH without its fields
        b"\x09" + INSTANCE.bytes,  # unknown kind
        mirroring.encode(MESSAGES["confirm"]) + b"\x00",  # trailing byte
        b"\x02" + INSTANCE.bytes + struct.pack(">QQB", 1, 1, 2),  # final flag 2
        b"\x05" + INSTANCE.bytes + struct.pack(">H", 2000) + b"x" * 2000,  # long reason
    ],
)
def test_malformed_messages_are_refused(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        mirroring.decode(body)


def test_malformed_statements_are_refused_before_allocating() -> None:
    good = mirroring.encode_statements(STATEMENTS)
    for cut in range(len(good)):
        with pytest.raises(RemoteProtocolError):
            mirroring.decode_statements(good[:cut])
    with pytest.raises(RemoteProtocolError, match="distinct"):
        mirroring.decode_statements(struct.pack(">I", mirroring.MAX_SQL_TEXTS + 1))
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        mirroring.decode_statements(struct.pack(">II", 1, mirroring.MAX_SQL_BYTES + 1))
    with pytest.raises(RemoteProtocolError, match="refers to text"):
        mirroring.decode_statements(struct.pack(">IIIH", 0, 1, 0, 0))
    with pytest.raises(RemoteProtocolError, match="tag"):
        mirroring.decode_statements(struct.pack(">IIIIH", 1, 0, 1, 0, 1) + b"\x07")
    with pytest.raises(RemoteProtocolError, match="trailing"):
        mirroring.decode_statements(good + b"\x00")


def test_the_encoder_refuses_what_a_mirror_would_refuse_and_keeps_what_it_had() -> None:
    """R-ROUTE-16: what the principal encodes, a mirror decodes. A statement that would take
    a unit beyond a bound (statements, bytes, distinct texts) is refused, and the encoder
    is left as it was: its output up to there still decodes."""
    encoder = mirroring.StatementsEncoder(max_statements=2)
    encoder.add(*STATEMENTS[0])
    encoder.add(*STATEMENTS[1])
    with pytest.raises(LocalProtocolError, match="more than 2 statements"):
        encoder.add(*STATEMENTS[2])
    assert mirroring.decode_statements(encoder.finish()) == STATEMENTS[:2]

    whole = len(mirroring.encode_statements(STATEMENTS))
    exact = mirroring.StatementsEncoder(max_bytes=whole)
    for statement in STATEMENTS:
        exact.add(*statement)
    assert exact.size == whole and exact.finish() == mirroring.encode_statements(STATEMENTS)
    short = mirroring.StatementsEncoder(max_bytes=whole - 1)
    short.add(*STATEMENTS[0])
    short.add(*STATEMENTS[1])
    with pytest.raises(LocalProtocolError, match="bytes"):
        short.add(*STATEMENTS[2])
    assert mirroring.decode_statements(short.finish()) == STATEMENTS[:2]

    texts = mirroring.StatementsEncoder()
    for i in range(mirroring.MAX_SQL_TEXTS):
        texts.add(f"DELETE FROM t WHERE a = {i}", ())
    with pytest.raises(LocalProtocolError, match="distinct statements"):
        texts.add("DELETE FROM t WHERE a = -1", ())
    texts.add("DELETE FROM t WHERE a = 0", ())  # a text it holds still goes
    assert len(mirroring.decode_statements(texts.finish())) == mirroring.MAX_SQL_TEXTS + 1
    # never above the mirror's own bounds
    wide = mirroring.StatementsEncoder(max_bytes=2**63, max_statements=2**63)
    assert (wide.max_bytes, wide.max_statements) == (
        mirroring.MAX_UNIT_BYTES,
        mirroring.MAX_STATEMENTS,
    )


def test_values_that_cannot_travel_are_our_mistake() -> None:
    with pytest.raises(LocalProtocolError):
        mirroring.encode_statements([("INSERT INTO t VALUES (?)", (2**64,))])
    with pytest.raises(LocalProtocolError):
        mirroring.encode_statements([("INSERT INTO t VALUES (?)", (object(),))])


def test_split_and_assemble_within_the_bound() -> None:
    data = bytes(range(256)) * 40
    chunks = mirroring.split(Kind.UNIT, INSTANCE, 5, 1, data, 1000)
    assert len(chunks) == 11 and [c.final for c in chunks] == [False] * 10 + [True]
    assembler = ChunkAssembler(len(data))
    results = [assembler.add(mirroring.decode(mirroring.encode(c))) for c in chunks]  # type: ignore[arg-type]
    assert results[:-1] == [None] * 10 and results[-1] == data
    assert mirroring.split(Kind.UNIT, INSTANCE, 6, 1, b"", 1000)[0].final
    small = ChunkAssembler(len(data) - 1)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        for chunk in chunks:
            small.add(chunk)
    assert small.buffered == 0
    mixed = ChunkAssembler(len(data))
    mixed.add(chunks[0])
    with pytest.raises(RemoteProtocolError, match="before the previous"):
        mixed.add(Chunk(Kind.UNIT, INSTANCE, 6, 1, True, b""))


def test_a_snapshot_cut_off_leaves_the_next_units_to_their_own_bound() -> None:
    """R-ROUTE-16: a copy of the file may be far larger than a unit of work. A copy that
    is cut off (a unit's chunk in its middle, or its connection lost) leaves the units
    after it bounded as units, not as copies; a whole copy still assembles."""
    assembler = ChunkAssembler(100, snapshot_limit=1000)
    snapshot = mirroring.split(Kind.SNAPSHOT, INSTANCE, 5, 1, b"s" * 900, 300)
    big_unit = mirroring.split(Kind.UNIT, INSTANCE, 6, 1, b"u" * 200, 50)
    assert assembler.add(snapshot[0]) is None
    with pytest.raises(RemoteProtocolError, match="before the previous"):
        assembler.add(big_unit[0])
    with pytest.raises(RemoteProtocolError, match="UNIT exceeds 100 bytes"):
        for chunk in big_unit:
            assembler.add(chunk)
    assert assembler.add(snapshot[0]) is None
    assembler.reset()  # the connection is lost, the mirror attaches again
    with pytest.raises(RemoteProtocolError, match="UNIT exceeds 100 bytes"):
        for chunk in big_unit:
            assembler.add(chunk)
    assert [assembler.add(chunk) for chunk in snapshot] == [None, None, b"s" * 900]
    with pytest.raises(RemoteProtocolError, match="SNAPSHOT exceeds 1000 bytes"):
        for chunk in mirroring.split(Kind.SNAPSHOT, INSTANCE, 7, 1, b"s" * 1001, 300):
            assembler.add(chunk)
    assert ChunkAssembler(1000).add(snapshot[0]) is None  # one bound for both by default


def test_a_mirror_frame_travels_protected_between_two_connections(pki: Pki) -> None:
    left, right = open_pair(pki)
    body = mirroring.encode(MESSAGES["unit"])
    (event,) = right.receive_data(left.send(Mirror(body)))
    assert event == Mirror(body)


if __name__ == "__main__" and "--regenerate" in sys.argv:
    GOLDEN.write_text(
        json.dumps({k: v.hex() for k, v in golden_vectors().items()}, indent=2) + "\n"
    )
