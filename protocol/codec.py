"""Helpers shared by the construct codecs of ``protocol/``.

* :func:`fixed_struct` derives a :class:`struct.Struct` from a construct
  ``Struct`` whose fields all have a fixed size. The layout stays declared once,
  in construct; the derived struct is the hot path (construct's own compiled
  parser spends ~4 µs per call building a ``Container``; ``struct`` takes
  ~0.2 µs). Tests check that both produce identical bytes.
* :class:`FastCodec` does the same for variable-size Structs (strings, blobs,
  arrays). It is also the *strict* parser: construct 2.10.70's compiled parser
  accepts a truncated ``Prefixed`` field (an unchecked ``io.read(n)``), so
  peer-supplied bytes are never parsed with compiled construct.
* FastCodec raises :class:`RemoteProtocolError` on parse (the bytes came from the
  peer) and :class:`LocalProtocolError` on build (our own values did not fit); no
  construct or struct exception leaves ``protocol/``. Users of a ``fixed_struct``
  (``frames.decode_header``) check the length before unpacking.
"""

from __future__ import annotations

import struct
from collections import namedtuple
from collections.abc import Mapping
from typing import Any

import construct as c

from protocol.errors import LocalProtocolError, RemoteProtocolError


def _field_format(con: Any) -> str:
    """The ``struct`` format character(s) of one fixed-size construct field."""
    if isinstance(con, c.Renamed):
        return _field_format(con.subcon)
    if isinstance(con, c.FormatField):
        return str(con.fmtstr).lstrip("<>=!")
    if isinstance(con, c.Bytes) and isinstance(con.length, int):
        return f"{con.length}s"
    if isinstance(con, c.Const | c.Enum | c.FlagsEnum):
        return _field_format(con.subcon)
    raise TypeError(f"field {con!r} has no fixed struct layout")


def fixed_struct(con: c.Struct) -> struct.Struct:
    """Derive the big-endian ``struct.Struct`` equivalent of a fixed-size construct Struct.

    Enum and FlagsEnum fields map to their integer; Const fields to their raw value.
    """
    fmt = ">" + "".join(_field_format(sub) for sub in con.subcons)
    derived = struct.Struct(fmt)
    if derived.size != con.sizeof():
        raise TypeError(f"derived struct size {derived.size} != construct size {con.sizeof()}")
    return derived


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


class FastCodec:
    """A parse/build pair derived from a construct ``Struct``, for hot paths.

    Supports the vocabulary the wire formats use: fixed-size fields (integers,
    ``Bytes(n)``, ``Const``, ``Enum``/``FlagsEnum`` as their integer),
    ``PascalString(u8/u16/u32, "utf8")``, ``Prefixed(int, GreedyBytes)``,
    ``PrefixedArray(int, fixed Struct | int | Prefixed(int, GreedyBytes))``, a final
    ``GreedyBytes`` and ``Terminated``.
    Values travel as flat tuples in declaration order (a fixed nested Struct inside
    an array is a tuple of its fields); ``Const`` fields are checked on parse and
    supplied on build, so they do not appear in the tuples.

    Tests check that FastCodec and construct produce identical bytes for the
    same values, so the construct declaration remains the single definition.
    """

    def __init__(self, con: c.Struct, name: str = "Record") -> None:
        self.steps: list[tuple[str, Any]] = []
        self.names: list[str] = []
        run: list[Any] = []
        for sub in con.subcons:
            kind = self._classify(sub)
            if kind == "fixed":
                run.append(sub)
                continue
            self._flush(run)
            run = []
            self.steps.append(kind)
            if sub.name:
                self.names.append(sub.name)
        self._flush(run)
        self.record: Any = namedtuple(name, self.names)  # type: ignore[misc]
        """The named-tuple type parse_record returns."""

    def parse_record(self, data: bytes) -> Any:
        """Parse into a named tuple with the declaration's field names."""
        return self.record._make(self.parse(data))

    def build_mapping(self, value: Mapping[str, Any]) -> bytes:
        """Build from a mapping of field name to value (Const fields supplied)."""
        try:
            row = tuple(value[name] for name in self.names)
        except KeyError as exc:
            raise LocalProtocolError(f"cannot encode: missing field {exc}") from None
        return self.build(row)

    def _flush(self, run: list[Any]) -> None:
        if not run:
            return
        fmt = ">" + "".join(_field_format(sub) for sub in run)
        consts = [
            (i, sub.subcon.value)
            for i, sub in enumerate(run)
            if isinstance(sub, c.Renamed) and isinstance(sub.subcon, c.Const)
        ]
        # struct pads or truncates "ns" fields silently; construct refuses: so do we.
        sized = [
            (i, sub.subcon.length)
            for i, sub in enumerate(run)
            if isinstance(sub, c.Renamed) and type(sub.subcon) is c.Bytes
        ]
        self.steps.append(("fixed", (struct.Struct(fmt), consts, len(run), sized)))
        self.names.extend(sub.name for sub in run if not _is_const(sub))

    @staticmethod
    def _classify(sub: Any) -> Any:
        con = sub.subcon if isinstance(sub, c.Renamed) else sub
        if con is c.Terminated:
            return ("end", None)
        if con is c.GreedyBytes:
            return ("rest", None)
        if (
            isinstance(con, c.StringEncoded)
            and isinstance(con.subcon, c.Prefixed)
            and con.subcon.subcon is c.GreedyBytes
        ):
            return ("str", (struct.Struct(con.subcon.lengthfield.fmtstr), con.encoding))
        if isinstance(con, c.Prefixed) and con.subcon is c.GreedyBytes:
            return ("blob", struct.Struct(con.lengthfield.fmtstr))
        if isinstance(con, c.FocusedSeq) and con.parsebuildfrom == "items":
            count_field = con.subcons[0].subcon.subcon
            item = con.subcons[1].subcon.subcon
            if isinstance(item, c.Prefixed) and item.subcon is c.GreedyBytes:
                return (
                    "blobs",
                    (struct.Struct(count_field.fmtstr), struct.Struct(item.lengthfield.fmtstr)),
                )
            scalar = not isinstance(item, c.Struct)
            item_codec = struct.Struct(">" + _field_format(item)) if scalar else fixed_struct(item)
            return ("array", (struct.Struct(count_field.fmtstr), item_codec, scalar))
        _field_format(con)  # raises TypeError when unsupported
        return "fixed"

    def parse(self, data: bytes) -> tuple[Any, ...]:
        out: list[Any] = []
        pos = 0
        size = len(data)
        try:
            for kind, arg in self.steps:
                if kind == "fixed":
                    codec, consts, _, _ = arg
                    values = codec.unpack_from(data, pos)
                    pos += codec.size
                    if consts:
                        for index, value in consts:
                            if values[index] != value:
                                raise RemoteProtocolError(f"expected constant {value!r}")
                        skip = {i for i, _ in consts}
                        values = tuple(v for i, v in enumerate(values) if i not in skip)
                    out.extend(values)
                elif kind == "str" or kind == "blob":
                    length_codec = arg[0] if kind == "str" else arg
                    (length,) = length_codec.unpack_from(data, pos)
                    pos += length_codec.size
                    if pos + length > size:
                        raise RemoteProtocolError("length prefix runs past the end")
                    raw = data[pos : pos + length]
                    pos += length
                    out.append(raw.decode(arg[1]) if kind == "str" else bytes(raw))
                elif kind == "array":
                    count_codec, item, scalar = arg
                    (count,) = count_codec.unpack_from(data, pos)
                    pos += count_codec.size
                    end = pos + count * item.size
                    if end > size:
                        raise RemoteProtocolError("array runs past the end")
                    rows = list(item.iter_unpack(data[pos:end]))
                    out.append([row[0] for row in rows] if scalar else rows)
                    pos = end
                elif kind == "blobs":
                    count_codec, length_codec = arg
                    (count,) = count_codec.unpack_from(data, pos)
                    pos += count_codec.size
                    blobs = []
                    for _ in range(count):
                        (length,) = length_codec.unpack_from(data, pos)
                        pos += length_codec.size
                        if pos + length > size:
                            raise RemoteProtocolError("length prefix runs past the end")
                        blobs.append(bytes(data[pos : pos + length]))
                        pos += length
                    out.append(blobs)
                elif kind == "rest":
                    out.append(bytes(data[pos:]))
                    pos = size
                elif pos != size:
                    raise RemoteProtocolError(f"{size - pos} trailing bytes")
        except (struct.error, UnicodeDecodeError) as exc:
            raise RemoteProtocolError(_short(exc)) from None
        return tuple(out)

    def build(self, values: tuple[Any, ...] | list[Any]) -> bytes:
        parts: list[bytes] = []
        it = iter(values)
        try:
            for kind, arg in self.steps:
                if kind == "fixed":
                    codec, consts, count, sized = arg
                    if consts:
                        const_at = dict(consts)
                        row = [const_at[i] if i in const_at else next(it) for i in range(count)]
                    else:
                        row = [next(it) for _ in range(count)]
                    for index, length in sized:
                        if len(_as_bytes(row[index])) != length:
                            raise TypeError(f"expected {length} bytes, got {len(row[index])}")
                    parts.append(codec.pack(*row))
                elif kind == "str" or kind == "blob":
                    length_codec = arg[0] if kind == "str" else arg
                    value = next(it)
                    raw = value.encode(arg[1]) if kind == "str" else _as_bytes(value)
                    parts.append(length_codec.pack(len(raw)))
                    parts.append(raw)
                elif kind == "array":
                    count_codec, item, scalar = arg
                    items = next(it)
                    parts.append(count_codec.pack(len(items)))
                    if scalar:
                        parts.extend(item.pack(value) for value in items)
                    else:
                        parts.extend(item.pack(*row) for row in items)
                elif kind == "blobs":
                    count_codec, length_codec = arg
                    blobs = next(it)
                    parts.append(count_codec.pack(len(blobs)))
                    for blob in blobs:
                        raw = _as_bytes(blob)
                        parts.append(length_codec.pack(len(raw)))
                        parts.append(raw)
                elif kind == "rest":
                    parts.append(_as_bytes(next(it)))
            if next(it, _END) is not _END:
                raise TypeError(f"more values than the {len(self.names)} fields")
        except (struct.error, StopIteration, UnicodeEncodeError, TypeError, AttributeError) as exc:
            raise LocalProtocolError(f"cannot encode: {_short(exc)}") from None
        return b"".join(parts)


_END = object()


def _as_bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    return bytes(value)


def _is_const(sub: Any) -> bool:
    return isinstance(sub, c.Renamed) and isinstance(sub.subcon, c.Const)
