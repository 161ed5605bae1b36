"""Catch-up patches: exact reconstruction, binding to records, size vs the sum of patches."""

from __future__ import annotations

import pytest
from test_chain_synth import adam_like_chain, build_chain, states_equal

from pulse_node.chain.catchup import apply_catchup, check_catchup, make_catchup
from pulse_node.codec.patch import apply_patch, make_patch
from pulse_node.errors import IntegrityError

STATES = adam_like_chain(31, 24)
CHAIN = build_chain(STATES, anchor_every=10)


@pytest.mark.parametrize("a,b", [(0, 1), (0, 24), (3, 11), (10, 20), (23, 24)])
@pytest.mark.parametrize("mode", ["compact", "overwrite"])
def test_catchup_reproduces_target_exactly(a: int, b: int, mode: str) -> None:
    patch = make_catchup(STATES[a], STATES[b], from_version=a, to_version=b, mode=mode)
    assert states_equal(apply_patch(STATES[a], patch, verify=True), STATES[b])
    out = apply_catchup(STATES[a], patch, from_record=CHAIN[a][0], to_record=CHAIN[b][0])
    assert states_equal(out, STATES[b])


def test_catchup_is_bound_to_both_records() -> None:
    patch = make_catchup(STATES[4], STATES[9], from_version=4, to_version=9)
    check_catchup(patch, from_record=CHAIN[4][0], to_record=CHAIN[9][0])
    for a, b in [(3, 9), (4, 8), (4, 10), (9, 4)]:
        with pytest.raises(IntegrityError):
            check_catchup(patch, from_record=CHAIN[a][0], to_record=CHAIN[b][0])
    other_run = build_chain(STATES[:10], anchor_every=10, run_id="other")
    with pytest.raises(IntegrityError):
        check_catchup(patch, from_record=CHAIN[4][0], to_record=other_run[9][0])
    with pytest.raises(ValueError):
        make_catchup(STATES[9], STATES[4], from_version=9, to_version=4)


@pytest.mark.parametrize("k", [8, 16])
def test_catchup_is_much_smaller_than_the_sum_of_patches(k: int) -> None:
    summed = sum(len(make_patch(STATES[v - 1], STATES[v], mode="compact")) for v in range(1, k + 1))
    single = len(make_catchup(STATES[0], STATES[k], from_version=0, to_version=k))
    # with 75% temporal locality the union of changed entries grows ~4x slower than the sum
    assert single < 0.6 * summed, (single, summed)
