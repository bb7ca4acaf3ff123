"""A dialog's send numbering after SENDs that did not commit (R-DLG-1): never a gap in
the numbers stored, never a number reused for a stored message.

The store refuses untried every job of a broken chain (``brokerd.storage.chains``); these
tests follow what the endpoint does with the failures it is told of, in the orders the
store and a transaction tell them (``Endpoint.give_back``, ``sends_failed`` of
``brokerd.dialogs.verbs.send``). ``tests/dialogs/test_full_disk.py`` shows the whole path
on a real broker whose file is full.
"""

from __future__ import annotations

from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.verbs.send import sends_failed
from brokerd.errors import StoreError, TransactionError
from brokerd.storage.chains import BrokenChains, Token
from tests.dialogs.endpoints import conversing_endpoint

FULL = StoreError("database 'shop': the disk is full")


def endpoint(send_sequence: int) -> Endpoint:
    return conversing_endpoint(send_sequence)


def number(ep: Endpoint) -> tuple[Token, int]:
    """What a SEND does before its job is submitted: its chain, then its number."""
    chain = ep.numbering
    ep.send_sequence += 1
    ep.uncommitted_sends += 1
    return chain, ep.send_sequence


def test_pipelined_sends_failing_first_first_go_back_to_the_last_stored() -> None:
    ep = endpoint(10)
    sends = [number(ep) for _ in range(3)]  # 11, 12, 13 in flight
    for chain, seq in sends:  # the store tells failures in submission order
        sends_failed(ep, chain, seq, FULL)
    assert ep.send_sequence == 10 and ep.uncommitted_sends == 0
    chain, seq = number(ep)
    assert seq == 11 and chain != sends[0][0]  # a new generation, which the store admits


def test_a_transactions_sends_undone_last_first_go_back_to_before_the_first() -> None:
    ep = endpoint(4)
    sends = [number(ep) for _ in range(3)]  # 5, 6, 7 in one transaction's work
    for chain, seq in reversed(sends):
        sends_failed(ep, chain, seq, FULL)
    assert ep.send_sequence == 4
    assert number(ep)[1] == 5


def test_a_transaction_refused_before_the_store_keeps_the_generation_of_sends_in_flight() -> None:
    """SENDs 11 and 12 are in flight; a transaction numbers 13 and is refused at COMMIT
    before anything reaches the store. 13 is given back and the generation stays: when
    11 then fails on a full disk, 12 is refused with it and the numbering goes back to
    10, and the store refuses any job still holding the old generation."""
    ep = endpoint(10)
    chains = BrokenChains()
    first, second = number(ep), number(ep)
    refused = number(ep)
    sends_failed(ep, *refused, TransactionError("a verb was refused"))
    assert ep.send_sequence == 12 and ep.numbering == first[0]
    chains.failed([first[0]], FULL)  # the committer thread: 11 failed
    assert chains.refusal([second[0]]) is not None  # 12 is refused untried
    sends_failed(ep, *first, FULL)
    sends_failed(ep, *second, FULL)
    assert ep.send_sequence == 10 and ep.uncommitted_sends == 0
    chain, seq = number(ep)
    assert seq == 11 and chains.refusal([chain]) is None


def test_a_rebuilt_endpoint_starts_above_the_generations_the_store_remembers() -> None:
    """After a mirror's role changes, endpoints are loaded again from the file: the
    chains their earlier objects broke must not refuse the new objects' SENDs."""
    old = endpoint(3)
    chains = BrokenChains()
    chain, seq = number(old)
    chains.failed([chain], FULL)
    sends_failed(old, chain, seq, FULL)
    rebuilt = endpoint(3)
    rebuilt.handle = old.handle
    assert chains.refusal([rebuilt.numbering]) is None
