"""Which partner of a mirrored route is principal, pure (SPEC R-ROUTE-10, R-ROUTE-15)."""

from __future__ import annotations

from brokerd.routing.mirrors import MirrorKey, MirrorPair

P1, P2 = "tcp://127.0.0.1:4022", "tcp://127.0.0.2:4022"


def pair() -> MirrorPair:
    return MirrorPair(MirrorKey(P1, P2, None, "//parts/OrderParts"))


def test_r_route_15_the_highest_epoch_wins_a_split_brain() -> None:
    p = pair()
    assert p.answer(P1, "principal", 0)
    assert p.principal == P1
    assert p.answer(P2, "principal", 1)  # promoted behind P1's back
    assert (p.principal, p.epoch) == (P2, 1)
    assert not p.answer(P1, "principal", 0)  # the old principal still claims it: ignored
    assert p.principal == P2


def test_r_route_15_a_stale_answer_is_ignored() -> None:
    p = pair()
    p.answer(P2, "principal", 3)
    assert not p.answer(P2, "mirror", 2)  # overtaken on the way
    assert p.principal == P2
    assert p.answer(P2, "mirror", 3)
    assert p.principal is None


def test_r_route_15_a_principal_below_the_highest_epoch_is_never_chosen() -> None:
    p = pair()
    p.answer(P1, "principal", 0)
    p.answer(P2, "principal", 1)
    assert p.unreachable(P2)
    assert p.principal is None  # P1 is fenced: send to neither (R-ROUTE-10)
    assert p.answer(P1, "principal", 2)  # P1 promoted again, above P2
    assert p.principal == P1
    assert "at epoch 2" in p.status()


def test_r_route_15_asked_again_while_a_principal_is_known() -> None:
    p = pair()
    assert p.needs_asking(10.0, 0.5, 2.0)  # never asked
    p.asked_at = 10.0
    p.answer(P1, "principal", 0)
    assert not p.needs_asking(11.0, 0.5, 2.0)
    assert p.needs_asking(12.0, 0.5, 2.0)
