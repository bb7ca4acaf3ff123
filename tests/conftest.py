"""Shared fixtures: a deployment CA, instance identities, an in-memory link
that pairs two sans-I/O connections (the h11 testing pattern), and the one Spark
session (local mode, two cores) the analytics tests share; headless Chromium for the
tests of pages (``tests.browser``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from brokerd.analytics.session import spark_session
from brokerd.tools.certs import Issued, create_ca, identity_for, issue_instance
from protocol import BrokerConnection, ConnectionSettings, EncryptionMode, Identity, Role
from protocol.events import Event

pytest_plugins = ["tests.browser", "tests.workers"]

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(autouse=True)
def no_daemon_traceback(tmp_path: Path) -> Iterator[None]:
    """Every daemon a test ran (its log under the test's ``tmp_path``) logged no
    traceback: an exception escaping into the event loop, or a crash at shutdown, fails
    the test even when what the test checked went well. Checked after the test's own
    fixtures stopped their daemons."""
    yield
    for log in sorted(tmp_path.rglob("brokerd.log")):
        text = log.read_text(errors="replace")
        at = text.find("Traceback")
        if at >= 0:
            pytest.fail(f"{log} logged a traceback:\n{text[max(0, at - 400) : at + 3000]}")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", driver_memory="2g", input_bytes=0)
    try:
        yield session
    finally:
        session.stop()


@dataclass(frozen=True)
class Pki:
    ca: Issued
    alpha: Identity
    beta: Identity
    other_ca: Issued
    stranger: Identity
    """Calls itself 'gamma', certificate issued by another CA."""


@pytest.fixture(scope="session")
def pki() -> Pki:
    # Issued at NOW, the time the sans-I/O connections are given, however late in the
    # session the fixture is first used (certificates are valid from 5 minutes before).
    ca = create_ca("brokerd test CA", now=NOW)
    other = create_ca("someone else's CA", now=NOW)
    return Pki(
        ca=ca,
        alpha=identity_for(issue_instance(ca, "alpha", now=NOW), ca),
        beta=identity_for(issue_instance(ca, "beta", now=NOW), ca),
        other_ca=other,
        stranger=identity_for(issue_instance(other, "gamma", now=NOW), ca),
    )


def make_pair(
    initiator: Identity,
    acceptor: Identity,
    initiator_mode: EncryptionMode = EncryptionMode.REQUIRED,
    acceptor_mode: EncryptionMode = EncryptionMode.REQUIRED,
    now: dt.datetime = NOW,
    **settings: object,
) -> tuple[BrokerConnection, BrokerConnection]:
    i = BrokerConnection(
        Role.INITIATOR,
        ConnectionSettings(initiator, encryption=initiator_mode, **settings),  # type: ignore[arg-type]
        now,
    )
    a = BrokerConnection(
        Role.ACCEPTOR,
        ConnectionSettings(acceptor, encryption=acceptor_mode, **settings),  # type: ignore[arg-type]
        now,
    )
    return i, a


def run_handshake(
    i: BrokerConnection,
    a: BrokerConnection,
    tamper: Callable[[str, bytes], bytes] | None = None,
) -> tuple[list[Event], list[Event]]:
    """Shuttle bytes between the two until neither has anything to say.

    ``tamper(direction, data)`` may rewrite bytes in flight ("i->a" / "a->i").
    RemoteProtocolError propagates to the caller.
    """
    tamper = tamper or (lambda _d, data: data)
    i_events: list[Event] = []
    a_events: list[Event] = []
    to_a = i.start()
    to_i = b""
    for _ in range(10):
        if to_a:
            a_events += a.receive_data(tamper("i->a", to_a))
        to_i = a.data_to_send()
        if to_i:
            i_events += i.receive_data(tamper("a->i", to_i))
        to_a = i.data_to_send()
        if not to_a and not to_i:
            break
    return i_events, a_events


def open_pair(pki: Pki, **kwargs: object) -> tuple[BrokerConnection, BrokerConnection]:
    i, a = make_pair(pki.alpha, pki.beta, **kwargs)  # type: ignore[arg-type]
    run_handshake(i, a)
    return i, a


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help="seconds of faults for the long soak (tests/tools/test_soak.py; run with -m soak)",
    )
