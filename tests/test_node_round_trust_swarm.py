"""Round safety in a running in-process swarm of two keyed trainers (``trainer/agreement.py``).

- A fake trainer (fresh key, announcing the trainer role and a far newer version) pushes payloads
  for this and coming rounds and decisions all the time: none gets in, no round waits for it,
  both trainers stay bit-identical and count the refusals.
- A member whose pushed payloads are scaled beyond the value bound: the coordinator refuses them
  (never signs them), closes each round without waiting, and both trainers stay bit-identical.
"""

from __future__ import annotations

import threading

import msgpack
import pytest
from helpers import all_at_version, assert_trainers_identical, read_status, wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus
from pulse_node.config import TrainerConfig
from pulse_node.loco.decision import encode_decision, make_decision
from pulse_node.loco.payload import LocoPayload, decode_values, encode_payload, encode_values
from pulse_node.testing.inprocess import InProcessSwarm, node_version
from pulse_node.testing.memory import announced
from pulse_node.vocab import DEFAULT_RUN_ID

LOCO = {"inner_steps": 2, "deadline_s": 20.0, "decision_wait_s": 2.0}
NAMES = ("trainer-a", "trainer-b")


def _keyed(node_cfg, tmp_path, **loco):
    """Configs of two trainers that trust exactly their two keys (identities made beforehand)."""
    keys = [Identity.load_or_create(tmp_path / n / "identity.key").public_key_hex for n in NAMES]
    return {n: node_cfg(TrainerConfig, n, loco={**LOCO, **loco}, chain={"trusted_trainers": keys}) for n in NAMES}


def _fake_trainer(swarm: InProcessSwarm, dirs, stop: threading.Event) -> None:
    """Announce the trainer role under a fresh key and push payloads and decisions until stopped."""
    me, key = "fake-trainer", Identity.generate()
    t = swarm.hub.join(me, lambda request: None)
    t.publish(PeerStatus(role="trainer", version=1000, node_key=key.public_key_hex))
    peers = [announced(n, PeerStatus(role="trainer")) for n in NAMES]
    while not stop.wait(0.1):
        r = max(node_version(d) for d in dirs.values()) if dirs else 0
        for rnd in (r, r + 1, r + 2):
            p = LocoPayload(round=max(rnd, 0), trainer_id=me, base_hash=b"\0" * 32)
            d = make_decision(key, run_id=DEFAULT_RUN_ID, round=max(rnd, 0), base=b"\0" * 32, epoch=b"\0" * 32, coordinator=me,
                              contributors={me: b"\0" * 32})
            for peer in peers:
                for kind, data in (("loco", encode_payload(p)), ("loco_decision", encode_decision(d))):
                    try:
                        t.push(peer, kind, data, timeout=1.0)
                    except Exception:  # a trainer not up yet
                        pass


def _round_times_ok(dirs) -> None:
    """Rounds closed when both payloads were in (or refused), not at the 20 s deadline."""
    for name, d in dirs.items():
        at = {h.version: h.at for h in read_status(d).history}
        slow = [v for v in range(2, 5) if at[v] - at[v - 1] >= LOCO["deadline_s"]]
        assert not slow, f"{name} waited for the deadline in rounds {slow}"


@pytest.mark.slow
def test_a_fake_trainer_neither_contributes_nor_stalls_a_keyed_swarm(node_cfg, tmp_path):
    swarm, stop, dirs = InProcessSwarm(), threading.Event(), {}
    fake = threading.Thread(target=_fake_trainer, args=(swarm, dirs, stop), daemon=True)
    try:
        dirs.update({n: swarm.start(n, cfg) for n, cfg in _keyed(node_cfg, tmp_path).items()})
        fake.start()
        wait_for(all_at_version(dirs.values(), 4), timeout=300, what="both trainers at version 4")
    finally:
        stop.set()
        swarm.stop_all()
        fake.join(timeout=10)
    assert not swarm.errors, swarm.errors
    assert_trainers_identical(dirs, range(1, 5))
    _round_times_ok(dirs)
    for name, d in dirs.items():
        st = read_status(d)
        assert st.contributors == 2, (name, st.contributors)
        refused = st.trainer.loco_refused
        assert refused.get("not_member", 0) >= 1 and refused.get("banned", 0) >= 1, (name, refused)
        assert st.trainer.resyncs <= 1 and not st.trainer.forks and not st.trainer.decisions_pulled, st.trainer  # genesis


def _scaled(data: bytes) -> bytes:
    """A base-free dense payload with every value times 1e4, plus 1 (a member gone wrong)."""
    msg = msgpack.unpackb(data, raw=False)
    count = sum(c for _, c in msg["tensors"])
    msg["values"] = encode_values(decode_values(msg["values"], count) * 1e4 + 1.0)
    return msgpack.packb(msg, use_bin_type=True)


class _Scaling:
    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def push(self, peer, kind, data, *, timeout):
        return self.inner.push(peer, kind, _scaled(data) if kind == "loco" else data, timeout=timeout)


@pytest.mark.slow
def test_a_members_payload_beyond_the_bound_is_never_signed_nor_applied(node_cfg, tmp_path):
    swarm = InProcessSwarm(wrap=lambda name, t: _Scaling(t) if name == "trainer-b" else t)
    try:
        dirs = {n: swarm.start(n, cfg)  # dense (every entry sent), base-free payloads: easy to rewrite
                for n, cfg in _keyed(node_cfg, tmp_path, base_coding=False, gate="none").items()}
        wait_for(all_at_version(dirs.values(), 4), timeout=300, what="both trainers at version 4")
    finally:
        swarm.stop_all()
    assert not swarm.errors, swarm.errors
    assert_trainers_identical(dirs, range(1, 5))
    _round_times_ok(dirs)
    a, b = read_status(dirs["trainer-a"]), read_status(dirs["trainer-b"])
    assert a.trainer.loco_refused.get("out_of_bound", 0) >= 3, a.trainer.loco_refused
    # in a's rounds b is left out; in b's rounds a fetches b's payload as b holds it (unscaled),
    # by the decided digest: either way both average the same payloads, never a scaled one
    assert a.contributors == b.contributors and not b.trainer.forks and not a.trainer.forks
    assert b.trainer.rounds_left_out + a.trainer.loco_fetched >= 3, (a.trainer, b.trainer)
