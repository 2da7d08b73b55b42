"""router/routing/ledger.py: the KVRouter's count of this gateway's own load per replica, stepped
request by request with a hand-driven clock, and left empty once every request has ended."""

from __future__ import annotations

import random

import pytest

from router.routing.ledger import STALE_STATS_S, LoadLedger
from router.routing.types import Worker

PREFILL = Worker("interactive-prefill-p0", "p0", "interactive", "prefill")
PREFILL_2 = Worker("interactive-prefill-p1", "p1", "interactive", "prefill")
DECODE = Worker("interactive-decode-d0", "d0", "interactive", "decode")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ledger(max_pending: int = 10_000) -> tuple[LoadLedger, Clock]:
    clock = Clock()
    return LoadLedger(clock=clock, timer=clock, max_pending=max_pending), clock


def test_a_remote_prompt_is_queued_until_done_then_discounted_for_the_stale_window():
    led, clock = ledger()
    led.expect("a", 300)
    assert led.queued_tokens("p0") == 0 and led.leftovers() == {"pending": 1}
    led.start("a", PREFILL)
    assert (led.in_flight("p0"), led.queued_tokens("p0")) == (1, 300)
    clock.now += 0.5
    timed = led.prompt_done("a", observe=True)
    assert (timed.worker, timed.tokens, timed.seconds) == (PREFILL, 300, pytest.approx(0.5))
    assert led.prompt_done("a", observe=True) is None  # once: a second call releases nothing
    led.end(PREFILL)
    assert (led.in_flight("p0"), led.queued_tokens("p0"), led.recently_done("p0")) == (0, 0, 300)
    assert led.leftovers() == {"done": 1}  # the replica's last report may still count it
    clock.now += STALE_STATS_S + 0.1
    assert led.recently_done("p0") == 0
    assert led.leftovers() == {}


def test_only_a_prompt_queued_behind_nothing_of_this_gateway_is_a_sample():
    led, _ = ledger()
    for rid in ("a", "b"):
        led.expect(rid, 100)
        led.start(rid, PREFILL)
    assert led.queued_tokens("p0") == 200
    assert led.prompt_done("b", observe=True) is None  # queued behind a: no clean sample
    assert led.prompt_done("a", observe=True) is not None
    assert led.prompt_done("c", observe=True) is None  # never started: nothing held


def test_a_failed_hop_releases_its_prompt_without_a_sample():
    led, _ = ledger()
    led.expect("a", 300)
    led.start("a", PREFILL)
    assert led.prompt_done("a", observe=False) is None
    led.end(PREFILL)
    assert led.queued_tokens("p0") == 0 and led.recently_done("p0") == 300


def test_a_local_prompt_is_queued_on_decode_until_its_first_token_and_never_timed():
    led, _ = ledger()
    led.expect("a", 300)
    led.start("a", DECODE)
    assert led.queued_tokens("d0") == 300
    assert led.prompt_done("a", observe=True) is None  # decode never times its own prompts
    assert led.queued_tokens("d0") == 0 and led.in_flight("d0") == 1  # it streams on
    led.end(DECODE)
    assert led.leftovers() == {}  # a decode replica's prompts are not kept for the discount


def test_a_hop_with_no_prompt_counts_only_in_flight():
    led, _ = ledger()
    led.start("a", DECODE)  # a decode hop after a remote prefill: the prompt is computed
    assert (led.in_flight("d0"), led.queued_tokens("d0")) == (1, 0)
    assert led.prompt_done("a", observe=True) is None
    led.end(DECODE)
    assert led.leftovers() == {}


def test_decisions_whose_hop_never_starts_are_bounded():
    led, _ = ledger(max_pending=3)
    for i in range(5):
        led.expect(f"r{i}", 10)
    assert led.leftovers() == {"pending": 3}
    led.start("r0", PREFILL)  # the oldest aged out: its hop queues nothing
    assert led.queued_tokens("p0") == 0
    led.start("r4", PREFILL)
    assert led.queued_tokens("p0") == 10


def test_every_map_is_empty_once_every_request_has_ended():
    """Many requests, interleaved at random, each through the ledger's call order (some local,
    some failing, some with a second hop); nothing is left once all end and the window passes."""
    led, clock = ledger()
    rng = random.Random(30)
    steps = {}  # request_id → its remaining steps
    for i in range(200):
        worker = rng.choice([PREFILL, PREFILL_2, DECODE])
        plan = [("expect", worker), ("start", worker), ("done", worker), ("end", worker)]
        if worker.pool == "prefill" and rng.random() < 0.5:  # then its decode hop
            plan += [("start", DECODE), ("done", DECODE), ("end", DECODE)]
        steps[f"r{i}"] = plan
    while steps:
        rid = rng.choice(sorted(steps))
        step, worker = steps[rid].pop(0)
        clock.now += rng.random() * 0.01
        if step == "expect":
            led.expect(rid, rng.randrange(1, 500))
        elif step == "start":
            led.start(rid, worker)
        elif step == "done":
            led.prompt_done(rid, observe=rng.random() < 0.8)
        else:
            led.end(worker)
        if not steps[rid]:
            del steps[rid]
        assert all(led.in_flight(r) >= 0 and led.queued_tokens(r) >= 0 for r in ("p0", "p1", "d0"))
    assert set(led.leftovers()) <= {"done"}
    clock.now += STALE_STATS_S + 0.1
    assert led.leftovers() == {}


DECODE_2 = Worker("interactive-decode-d1", "d1", "interactive", "decode")


def test_a_booked_decode_pick_counts_in_flight_from_the_route_through_its_hop_once():
    led, _ = ledger()
    led.book("a", DECODE)
    assert led.in_flight("d0") == 1 and led.leftovers() == {"in_flight": 1, "booked": 1}
    led.start("a", PREFILL)  # the prefill hop first: the decode booking stays
    assert (led.in_flight("p0"), led.in_flight("d0")) == (1, 1)
    led.end(PREFILL)
    led.start("a", DECODE)  # the decode hop takes the booking over: still one
    assert led.in_flight("d0") == 1 and "booked" not in led.leftovers()
    led.unbook("a")  # the attempt's end: nothing left to release
    assert led.in_flight("d0") == 1
    led.end(DECODE)
    assert led.leftovers() == {}


def test_a_booking_moves_to_the_decode_replica_that_ran_and_is_released_if_none_did():
    led, _ = ledger()
    led.book("a", DECODE)
    led.start("a", DECODE_2)  # Serve's pick or a fallback: the other replica after all
    assert (led.in_flight("d0"), led.in_flight("d1")) == (0, 1)
    led.end(DECODE_2)
    led.book("b", DECODE)
    led.book("b", DECODE_2)  # routed again (a continuation): the new pick replaces the old
    assert (led.in_flight("d0"), led.in_flight("d1")) == (0, 1)
    led.unbook("b")  # the client left before decode started
    led.unbook("b")  # twice: nothing more
    assert led.leftovers() == {}


def test_bookings_are_bounded_when_their_owners_never_release_them():
    led, _ = ledger(max_pending=3)
    for i in range(5):
        led.book(f"r{i}", DECODE)
    assert led.in_flight("d0") == 3 and led.leftovers() == {"in_flight": 1, "booked": 3}
