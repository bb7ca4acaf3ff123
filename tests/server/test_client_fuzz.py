"""Random requests from a logged-in client against a live daemon (the client wire's
semantic layer; the frame decoder is fuzzed sans-I/O in tests/protocol).

Thousands of requests with every operation name and random values for every field
a handler reads (wrong types, huge and negative numbers, unknown names, nested
values), in a fixed seed's order. Every request must get a reply (OK or a typed
error), the daemon must log no unexpected exception (an untyped failure is a bug:
bad input gets a clear error), and a legitimate dialog must still deliver after.
``BROKERD_FUZZ_SEED`` picks another seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.sdk import requests
from brokerd.sdk.client import BrokerClient
from brokerd.server.client_requests import OPERATIONS
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.errors import BrokerError
from tests.daemons import FAST_RETRY, drain, running

OPS = [*OPERATIONS, "login", "no_such_operation"]
"""Every operation the client listener serves, the login, and one it does not know."""
FIELDS = [
    "body_length",
    "broker_instance",
    "cleanup",
    "contract",
    "conversation_group_id",
    "conversation_handle",
    "database",
    "description",
    "error_code",
    "from_outside",
    "from_service",
    "lifetime",
    "message_type",
    "messages",
    "name",
    "queue",
    "related_conversation",
    "retriable",
    "role",
    "route",
    "service",
    "status",
    "timeout",
    "to_broker_instance",
    "to_service",
    "top",
    "transaction",
    "address",
    "mirror_address",
]
NAMES = [
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    CONTRACT,
    ORDER,
    "OrderQueue",
    "ClientQueue",
    "shop",
    "warehouse",
    "DEFAULT",
    "tcp://127.0.0.2:4022",
    "LOCAL",
    "TRANSPORT",
    "principal",
    "http://[::1",
    "",
]


def value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(14 if depth < 2 else 10)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, -1, 7, 2**31, -(2**63), 2**63 - 1, 10**6])
    if kind == 3:
        return rng.choice([0.0, -1.5, 1e308, 3.25])
    if kind in (4, 5, 6):
        return rng.choice(NAMES)
    if kind == 7:
        return str(uuid.uuid4())
    if kind == 8:
        return "".join(rng.choice("ab\u00e9\u4e2d/\x00 ") for _ in range(rng.randrange(40)))
    if kind == 9:
        return "x" * rng.choice([1, 300, 5000])
    if kind in (10, 11):
        return [value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(FIELDS): value(rng, depth + 1) for _ in range(rng.randrange(4))}


def valid(rng: random.Random, known: list[str], tx: list[int]) -> tuple[dict[str, Any], bytes]:
    """A well-formed request of a random operation, built as the SDK builds it."""
    handle = uuid.UUID(rng.choice(known))
    op = rng.randrange(14)
    if op == 0:
        return requests.begin_dialog_request(
            SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT, None, None, rng.choice([0, 3600]), None
        )
    if op in (1, 2):
        return requests.send_request(handle, ORDER, rng.choice([b"<a/>", b"x" * 40000]))
    if op == 3:
        return requests.send_many_request([(handle, ORDER, b"m")] * rng.randrange(1, 4))
    if op == 4:
        return requests.receive_request(
            rng.choice(["ClientQueue", "OrderQueue"]), None, rng.randrange(1, 50), 0, None
        )
    if op == 5:
        return requests.end_conversation_request(
            handle, rng.choice([None, 50]), "fuzz", rng.random() < 0.1
        )
    if op == 6:
        return requests.timer_request(handle, rng.choice([0.5, 60]))
    if op == 7:
        return requests.move_request(handle, uuid.uuid4())
    if op == 8:
        return {"op": "begin_transaction"}, b""
    if op == 9:
        return {"op": rng.choice(["commit", "rollback"]), "transaction": rng.choice(tx or [1])}, b""
    if op == 10:
        name = rng.choice(["conversation_endpoints", "transmission_queue", "stats", "queues"])
        return {"op": "view", "name": name}, b""
    if op == 11:
        return {"op": "explain", "database": "shop", "service": WAREHOUSE_SERVICE}, b""
    if op == 12:
        route = {"name": f"R{rng.randrange(5)}", "address": "tcp://127.0.0.9:4022"}
        return {"op": "create_route", "database": "shop", "route": route}, b""
    return {"op": "alter_queue", "queue": "ClientQueue", "status": True, "database": None}, b""


def request(rng: random.Random, known: list[str], tx: list[int]) -> tuple[dict[str, Any], bytes]:
    """Half the time a well-formed request with one or two fields changed (and a transaction
    named now and then), otherwise any operation with random fields."""
    if rng.random() < 0.5:
        meta, body = valid(rng, known, tx)
        meta = dict(meta)
        for _ in range(rng.randrange(3)):
            meta[rng.choice([*meta, *FIELDS])] = value(rng)
        if tx and rng.random() < 0.2:
            meta["transaction"] = rng.choice(tx)
        meta["op"] = meta.get("op") if isinstance(meta.get("op"), str) else "send"
        return meta, body
    meta = {"op": rng.choice(OPS)}
    for name in rng.sample(FIELDS, rng.randrange(6)):
        if name in ("conversation_handle", "related_conversation") and rng.random() < 0.5:
            meta[name] = rng.choice(known)
        else:
            meta[name] = value(rng)
    body = rng.choice([b"", b"<a/>", b"\xff\xfe", bytes(rng.randrange(3000))])
    return meta, body


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running(shop_and_warehouse(tmp_path, FAST_RETRY)) as d:
        yield d


async def test_random_requests_get_typed_answers_and_break_nothing(
    deployment: Deployment,
) -> None:
    rng = random.Random(int(os.environ.get("BROKERD_FUZZ_SEED", "20261124")))
    fuzzer = await deployment.daemons["alpha"].client()
    known = [str(await fuzzer.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT))]
    transactions: list[int] = []
    outcomes: dict[str, int] = {}
    for _ in range(3000):
        meta, body = request(rng, known, transactions)
        try:
            reply, _ = await asyncio.wait_for(fuzzer._call(meta, body), 10)
        except BrokerError as exc:
            key = f"{meta['op']}: {type(exc).__name__}"
        else:
            key = f"{meta['op']}: ok"
            handle = reply.get("conversation_handle")
            if isinstance(handle, str):
                known.append(handle)
            if isinstance(reply.get("transaction"), int):
                transactions.append(reply["transaction"])
        outcomes[key] = outcomes.get(key, 0) + 1
    succeeded = {key for key in outcomes if key.endswith(": ok")}
    assert len(succeeded) >= 8, outcomes  # the fuzzing reached past the validation

    log = deployment.daemons["alpha"].log_path.read_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 300 :][:3000]
    assert (await fuzzer.ping())["instance"]

    shop: BrokerClient = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"after the fuzzing")
    bodies: list[bytes] = []
    while b"after the fuzzing" not in bodies:  # behind whatever the fuzzer sent there
        bodies += [m.message_body for m in await drain(warehouse, "OrderQueue", 1, timeout=30)]
    await fuzzer.close()
    await shop.close()
    await warehouse.close()
