"""Hostile peers: a node announcing itself as a trainer and serving forged versions is rejected.

One honest trainer and one inference node that trusts only that trainer's key run on the
in-memory transport next to a rogue peer that claims to hold a far newer version and serves
records signed by its own key, and garbage patches. The inference node must follow the honest chain
only, count the rejections, and stop asking the rogue.
"""

from __future__ import annotations

import os
from pathlib import Path

from pulse_node.chain.identity import Identity
from pulse_node.chain.record import encode_record, make_record
from pulse_node.codec.state import write_atomic
from pulse_node.config import InferenceConfig, TrainerConfig
from pulse_node.node.transport import PeerInfo
from tests.conftest import wait_for
from tests.test_node_memory_swarm import _cfg, _status, swarm  # noqa: F401 (fixture)


def _rogue(hub, tmp: Path, run_id: str) -> None:
    """A peer that claims version 1000 and serves self-signed records and random patches."""
    ident = Identity.generate()
    files = tmp / "rogue"
    chain: list = []

    def forged(v: int):
        while len(chain) <= v:  # a well-formed chain, signed by a key nobody trusts
            n = len(chain)
            chain.append(make_record(ident, run_id=run_id, version=n, parent=chain[-1] if chain else None,
                                     state_hash="ab" * 32, patch=os.urandom(64) if n else None,
                                     anchor_version=0, is_anchor=n == 0, codec="pulsesync/compact/1"))
        return chain[v]

    def resolve(kind: str, params: dict):
        v = int(params.get("version", 0))
        path = files / f"{kind}-{v}"
        if kind == "record":
            write_atomic(path, encode_record(forged(v)))
        else:
            write_atomic(path, os.urandom(4096))
        return path

    transport = hub.join("rogue", resolve)
    # announced as an inference peer: inference peers are preferred providers, so it is asked first
    transport.publish(PeerInfo(peer_id="rogue", role="inference", address="", version=1000, lowest=0,
                               anchors=[0, 990], node_key=ident.public_key_hex))


def test_forged_versions_are_rejected_and_rogue_ignored(swarm, tmp_path):  # noqa: F811
    trainer_dir = tmp_path / "t1"
    key = Identity.load_or_create(trainer_dir / "identity.key").public_key_hex
    _rogue(swarm.hub, tmp_path, "pulse-default")
    t1 = swarm.start("trainer-a", _cfg(TrainerConfig, tmp_path, "t1"))
    i1 = swarm.start("infer-a", _cfg(InferenceConfig, tmp_path, "i1", chain={"trusted_trainers": [key]}))
    wait_for(lambda: _status(i1).get("version", -1) >= 3, timeout=240, what="inference node at version 3")
    applied = _status(i1)["history"]
    published = lambda: {h["version"]: h["state_hash"] for h in _status(t1).get("history", [])}  # noqa: E731
    wait_for(lambda: {h["version"] for h in applied} <= set(published()), timeout=10, what="trainer status")
    trainer = published()
    assert applied and all(trainer[h["version"]] == h["state_hash"] for h in applied)
    assert max(h["version"] for h in applied) < 1000
    assert _status(i1).get("rejected", 0) >= 1, "the rogue was never caught"
