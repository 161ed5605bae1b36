"""Spot-check wire structs, torch-free: Merkle openings, inner-step commitments, openings,
evidence and the round-seeded draw. Hostile input gets typed errors; nothing is trusted unsigned."""

from __future__ import annotations

import dataclasses

import blake3
import msgpack
import numpy as np
import pytest

from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.commit import (
    COMMIT_FORMAT,
    MAX_COMMIT_BYTES,
    STATE_GLOBAL,
    BatchRef,
    InnerCommitment,
    StepCommit,
    decode_commitment,
    encode_commitment,
    sign_commitment,
    verify_commitment,
)
from pulse_node.loco.merkle import MerkleTree, leaf_bytes, verify_leaf
from pulse_node.loco.opening import (
    GRAD_DOMAIN,
    STATE_DOMAIN,
    FlatLayout,
    RoundOpening,
    decode_opening,
    encode_opening,
    verify_opening,
)
from pulse_node.loco.spot_evidence import (
    Accusation,
    decode_evidence,
    encode_evidence,
    make_evidence,
    sign_accusation,
    verify_accusation,
)
from pulse_node.loco.spotdraw import draw_check, draw_targets, max_rate, rounds_to_catch

KEY = Identity.generate()
LEAF, N = 256, 1000  # 4 leaves, the last one short
D = bytes(range(32))


def arrays(n: int = N, k: int = 3, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(k)]


@pytest.mark.parametrize("n", [1, 255, 256, N, 5 * 256 + 3])
def test_every_leaf_of_every_tree_shape_verifies(n: int) -> None:
    a = arrays(n)
    tree = MerkleTree.build(a, leaf=LEAF, domain=STATE_DOMAIN)
    for i in range(len(tree.levels[0])):
        verify_leaf(tree.root, domain=STATE_DOMAIN, elements=n, leaf=LEAF, index=i, data=leaf_bytes(a, i, LEAF),
                    path=tree.prove(i), arrays=3)


def test_the_tree_is_the_same_on_any_number_of_threads() -> None:
    a = arrays(64 * 256 + 5, k=2)
    roots = {MerkleTree.build(a, leaf=LEAF, domain=GRAD_DOMAIN, threads=t).root for t in (1, 3)}
    assert len(roots) == 1


def test_a_leaf_verifies_nowhere_else() -> None:
    a = arrays()
    tree = MerkleTree.build(a, leaf=LEAF, domain=STATE_DOMAIN)
    good = {"domain": STATE_DOMAIN, "elements": N, "leaf": LEAF, "index": 1, "data": leaf_bytes(a, 1, LEAF),
            "path": tree.prove(1), "arrays": 3}
    bad = [{"data": leaf_bytes(a, 2, LEAF)}, {"index": 2}, {"domain": GRAD_DOMAIN}, {"elements": N + 1},
           {"path": tree.prove(1)[:-1]}, {"path": [*tree.prove(1), D]}, {"index": 9}, {"arrays": 2},
           {"data": bytes(len(good["data"]))}]
    for change in bad:
        with pytest.raises(IntegrityError):
            verify_leaf(tree.root, **(good | change))


def commitment(count: int = 3, **over) -> InnerCommitment:
    step = StepCommit((BatchRef("12D3KooWproducer", 4, 1, D),), D, D, 0.5)
    c = InnerCommitment(run_id="run", round=4, trainer=peer_id_of_key(KEY.public_key_hex), signer="", base=D,
                        payload=D, settings=D, params=N, leaf=LEAF, adam_step=30, state=STATE_GLOBAL, state_root=D,
                        steps=(step,) * count)
    return sign_commitment(KEY, dataclasses.replace(c, **over))


def test_a_commitment_round_trips_and_its_signature_binds_every_field() -> None:
    c = commitment()
    back = decode_commitment(encode_commitment(c))
    assert back == c and back.digest() == c.digest() and back.stepped == [0, 1, 2]
    verify_commitment(back, signer_key=KEY.public_key_hex)
    for change in ({"round": 5}, {"adam_step": 31}, {"payload": bytes(32)}, {"steps": c.steps[:2]}):
        with pytest.raises(IntegrityError):
            verify_commitment(dataclasses.replace(c, **change), signer_key=KEY.public_key_hex)
    with pytest.raises(IntegrityError):
        verify_commitment(c, signer_key=Identity.generate().public_key_hex)


def _raw(c: InnerCommitment) -> list:
    return msgpack.unpackb(encode_commitment(c), raw=False)


@pytest.mark.parametrize("mutate", [
    lambda r: r[:-1],  # a field missing
    lambda r: [*r[:1], COMMIT_FORMAT + 1, *r[2:]],  # another format
    lambda r: [*r[:3], "4", *r[4:]],  # round as a string
    lambda r: [*r[:8], D[:8], *r[9:]],  # a short settings digest
    lambda r: [*r[:10], 1000, *r[11:]],  # leaf size not a power of two in range
    lambda r: [*r[:12], ["m", "v"], *r[13:]],  # start state names nobody declared
    lambda r: [*r[:14], [[[], D, D, 0.5]], *r[15:]],  # a step without batches
    lambda r: [*r[:14], [[[["p", 1, 0, D]], D, D, float("nan")]], *r[15:]],  # a NaN norm
    lambda r: [*r[:14], [[[["p", 1, 0, D[:5]]], D, D, 0.5]], *r[15:]],  # a short digest
])
def test_malformed_commitments_are_wire_errors(mutate) -> None:
    with pytest.raises(WireError):
        decode_commitment(msgpack.packb(mutate(_raw(commitment())), use_bin_type=True))


def test_garbage_and_oversized_commitments_are_refused_before_parsing() -> None:
    for data in (b"", b"\xc1", b"x" * (MAX_COMMIT_BYTES + 1), msgpack.packb({"a": 1})):
        with pytest.raises(WireError):
            decode_commitment(data)
    with pytest.raises(ValueError):
        commitment(count=2000)  # more steps than the format allows: refused when signing


def opening_of(c_arrays, grads, leaves) -> tuple[InnerCommitment, RoundOpening]:
    st = MerkleTree.build(c_arrays, leaf=LEAF, domain=STATE_DOMAIN)
    gts = [MerkleTree.build([g], leaf=LEAF, domain=GRAD_DOMAIN) for g in grads]
    step = StepCommit((BatchRef("p", 1, 0, D),), D, D, 0.5)
    c = commitment(state_root=st.root, steps=tuple(dataclasses.replace(step, grad_root=t.root) for t in gts))
    o = RoundOpening(c.round, c.trainer, leaves, tuple((leaf_bytes(c_arrays, i, LEAF), tuple(st.prove(i)))
                                                        for i in leaves),
                     tuple(tuple((leaf_bytes([g], i, LEAF), tuple(t.prove(i))) for i in leaves)
                           for g, t in zip(grads, gts)))
    return c, o


def test_an_opening_round_trips_verifies_and_refuses_what_does_not_match() -> None:
    state, grads, leaves = arrays(), arrays(k=2, seed=1), (1, 3)
    c, o = opening_of(state, grads, leaves)
    got = verify_opening(decode_opening(encode_opening(o)), c, leaves)
    coords = FlatLayout(("w",), (N,)).coords(leaves, LEAF)
    assert np.array_equal(got.state["v"], state[1][coords]) and np.array_equal(got.grads[1], grads[1][coords])
    swapped = dataclasses.replace(o, grads=o.grads[::-1])
    for bad, at in ((o, (0, 3)), (swapped, leaves), (dataclasses.replace(o, grads=o.grads[:1]), leaves)):
        with pytest.raises(IntegrityError):
            verify_opening(bad, c, at)
    with pytest.raises(WireError):
        decode_opening(encode_opening(o), max_bytes=100)
    with pytest.raises(WireError):
        decode_opening(msgpack.packb(["pulse/inner-opening", 1, 4, "t", [1], [[b"x", "not a list"]], []]))


def test_flat_layout_maps_payload_entries_in_sorted_name_order() -> None:
    layout = FlatLayout.of({"b": (2, 3), "a": (4,)})
    assert layout.names == ("a", "b") and layout.offsets == {"a": 0, "b": 4} and layout.total == 10
    payload = {"b": (np.array([5, 0]), np.array([2.0, 1.0])), "a": (np.array([3]), np.array([3.0]))}
    at, vals = layout.entries_at(payload, np.array([1, 3, 4, 8, 9]))
    assert at.tolist() == [1, 2, 4] and vals.tolist() == [3.0, 1.0, 2.0]
    rng = np.random.default_rng(0)
    shapes = {f"t{i}": (int(rng.integers(1, 300)),) for i in range(12)}
    layout = FlatLayout.of(shapes)
    payload = {n: (np.sort(rng.choice(s[0], size=int(rng.integers(0, s[0] + 1)), replace=False)),
                   rng.standard_normal(s[0]).astype(np.float32)) for n, s in shapes.items() if rng.random() < 0.8}
    payload = {n: (idx, vals[:idx.size]) for n, (idx, vals) in payload.items()}
    coords = np.sort(rng.choice(layout.total, size=layout.total // 3, replace=False))
    flat = {int(layout.offsets[n] + i): float(v) for n, (idx, vals) in payload.items() for i, v in zip(idx, vals)}
    want = [(k, flat[int(c)]) for k, c in enumerate(coords) if int(c) in flat]
    at, vals = layout.entries_at(payload, coords)
    assert list(zip(at.tolist(), vals.tolist())) == want


def accusation(**over) -> Accusation:
    accuser = Identity.generate()
    exhibit = b"exhibit bytes"
    a = Accusation(run_id="run", round=4, target=peer_id_of_key(KEY.public_key_hex),
                   accuser=peer_id_of_key(accuser.public_key_hex), signer="", step=1, leaves=(2, 7), reason="gradient",
                   keep=1.0, commitment=encode_commitment(commitment()), next_commitment=b"",
                   exhibits=(("opening", blake3.blake3(exhibit).digest()),))
    return sign_accusation(accuser, dataclasses.replace(a, **over)), exhibit, accuser


def test_evidence_round_trips_and_refuses_foreign_or_altered_exhibits() -> None:
    a, exhibit, accuser = accusation()
    ev = make_evidence(a, {"opening": exhibit})
    back = decode_evidence(encode_evidence(ev))
    assert back.accusation == a and back.exhibits == ev.exhibits
    verify_accusation(back.accusation, signer_key=accuser.public_key_hex)
    with pytest.raises(IntegrityError):
        verify_accusation(dataclasses.replace(a, step=2), signer_key=accuser.public_key_hex)
    with pytest.raises(ValueError):
        make_evidence(a, {"opening": b"other bytes"})
    raw = msgpack.unpackb(encode_evidence(ev), raw=False)
    for exhibits in ([[blake3.blake3(b"x").digest(), b"x"]], [[a.exhibits[0][1], b"altered"]]):
        with pytest.raises(WireError):
            decode_evidence(msgpack.packb([*raw[:3], exhibits], use_bin_type=True))
    for over in ({"reason": "unanswered"}, {"leaves": (7, 2)}):
        with pytest.raises(ValueError):
            accusation(**over)
    with pytest.raises(WireError):
        decode_evidence(b"\x00" * 10)


def test_the_draw_is_deterministic_and_checks_newcomers_every_round() -> None:
    trainers = [f"t{i}" for i in range(6)]
    pairs = draw_targets(b"seed", trainers=trainers, rate=0.3, newcomers={"t5"})
    assert pairs == draw_targets(b"seed", trainers=trainers[::-1], rate=0.3, newcomers={"t5"})
    assert ("t5" in dict(pairs)) and all(t != v and v in trainers for t, v in pairs)
    hits = sum(len(draw_targets(bytes([i]), trainers=trainers, rate=0.3)) for i in range(200))
    assert 0.2 < hits / (200 * 6) < 0.4
    d = draw_check(b"seed", round=4, target="t1", verifier="t2", steps=10, params=N, leaf=LEAF, leaves=8)
    assert d.leaves == tuple(range(4)) and 0 <= d.step < 10  # 4 leaves exist: all are opened
    big = draw_check(b"seed", round=4, target="t1", verifier="t2", steps=10, params=10**6, leaf=LEAF)
    assert len(set(big.leaves)) == 8 and list(big.leaves) == sorted(big.leaves)
    assert max_rate(check_s=1.0, round_s=10.0, trainers=2) == pytest.approx(0.5)
    assert max_rate(check_s=1.0, round_s=10.0, commit_s=2.0) == 0.0
    assert rounds_to_catch(0.25) == 4.0 and rounds_to_catch(0.25, cheated_steps=1, steps=10) == 40.0

