"""Client frames of every kind, and the stream they make, for the client wire's tests."""

from __future__ import annotations

from protocol.client_wire import ClientFrame, ClientFrameKind, encode_frame

SAMPLES = [
    ClientFrame(ClientFrameKind.CHALLENGE, 0, {"nonce": "ab" * 32, "version": 1}),
    ClientFrame(ClientFrameKind.REQUEST, 1, {"op": "send", "to": "svc"}, b"\x00body\xff"),
    ClientFrame(ClientFrameKind.RESPONSE, 1, {"ok": True, "ids": [1, 2, 3]}),
    ClientFrame(ClientFrameKind.ERROR, 0xFFFF_FFFF, {"code": "nope", "msg": "déjà vu ☃"}),
    ClientFrame(ClientFrameKind.NOTICE, 0, {}, b"x" * 1000),
]
"""One frame of each kind."""
STREAM = b"".join(encode_frame(f) for f in SAMPLES)
"""The samples' bytes, one after another."""
