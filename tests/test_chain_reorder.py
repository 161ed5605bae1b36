"""Reorder buffer: in-order release under shuffling, duplicates, holes, window limits, reset."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_chain_synth import adam_like_chain, states_equal

from pulse_node.chain.reorder import ReorderBuffer
from pulse_node.codec.patch import apply_patch, make_patch

N = 100
STATES = adam_like_chain(21, N, shapes={"w": (64, 64)})  # one tensor: keeps 100s of applies fast
PATCHES = {v: make_patch(STATES[v - 1], STATES[v], mode="compact") for v in range(1, N + 1)}


def test_offer_rules() -> None:
    buf: ReorderBuffer[str] = ReorderBuffer(next_version=5, max_pending=4)
    assert buf.offer(4, "stale") is False
    assert buf.offer(9, "beyond window") is False and buf.window_end == 9
    assert buf.offer(7, "a") is True and buf.offer(7, "dup") is False
    assert buf.pop_ready() == [] and buf.gap() == (5, 7)
    assert buf.offer(5, "b") is True
    assert buf.gap() == (6, 7)
    assert buf.pop_ready() == [(5, "b")] and buf.next_version == 6
    assert buf.offer(6, "c") and buf.gap() is None
    assert buf.pop_ready() == [(6, "c"), (7, "a")] and buf.gap() is None and len(buf) == 0


def test_reset_keeps_only_usable_items() -> None:
    buf: ReorderBuffer[int] = ReorderBuffer(next_version=1, max_pending=8)
    for v in (3, 5, 8):
        buf.offer(v, v)
    buf.reset(5)
    assert buf.next_version == 5 and buf.pop_ready() == [(5, 5)] and buf.gap() == (6, 8)
    with pytest.raises(ValueError):
        ReorderBuffer(next_version=0, max_pending=0)


class Consumer:
    """An inference node's apply loop: state at ``applied``, patches strictly in order."""

    def __init__(self) -> None:
        self.applied = 0
        self.state = STATES[0]

    def drain(self, buf: ReorderBuffer[bytes]) -> None:
        for v, patch in buf.pop_ready():
            assert v == self.applied + 1, "released out of sequence"
            self.state = apply_patch(self.state, patch, verify=True)
            self.applied = v


def deliver(buf: ReorderBuffer[bytes], consumer: Consumer, queue: deque[int]) -> None:
    """Gossip: offer each arrival; refused-because-too-early ones are re-requested later."""
    stalled = 0
    while queue and stalled <= len(queue):
        v = queue.popleft()
        if buf.offer(v, PATCHES[v]):
            stalled = 0
            consumer.drain(buf)
        elif v >= buf.window_end:
            queue.append(v)
            stalled += 1


@settings(max_examples=10, deadline=None)
@given(order=st.permutations(range(1, N + 1)),
       dups=st.lists(st.integers(1, N), max_size=60),
       withheld=st.sets(st.integers(1, N), max_size=6),
       max_pending=st.sampled_from([4, 16, 64]),
       recover_by_anchor=st.booleans(), data=st.data())
def test_shuffled_duplicated_and_withheld_versions(order, dups, withheld, max_pending,
                                                   recover_by_anchor, data) -> None:
    arrivals = [v for v in order if v not in withheld]
    for v in dups:
        arrivals.insert(data.draw(st.integers(0, len(arrivals))), v)
    arrivals = [v for v in arrivals if v not in withheld]
    buf: ReorderBuffer[bytes] = ReorderBuffer(next_version=1, max_pending=max_pending)
    consumer = Consumer()
    queue = deque(arrivals)
    deliver(buf, consumer, queue)

    hole = min(withheld, default=N + 1)
    assert consumer.applied == hole - 1
    assert states_equal(consumer.state, STATES[consumer.applied])
    assert len(buf) <= max_pending
    gap = buf.gap()
    if withheld and len(buf):
        assert gap is not None and gap[0] == hole and gap[1] == max(buf._pending)
    else:
        assert gap is None

    if recover_by_anchor and withheld:  # load a full state past the hole, resume after it
        consumer.state, consumer.applied = STATES[max(withheld)], max(withheld)
        buf.reset(max(withheld) + 1)
        consumer.drain(buf)
    else:  # fetch the missing versions
        queue.extend(sorted(withheld, reverse=True))
    deliver(buf, consumer, queue)
    assert consumer.applied == N and buf.gap() is None and not queue
    assert states_equal(consumer.state, STATES[N])
