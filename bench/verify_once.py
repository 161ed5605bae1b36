"""Verify once: checks and seconds per version from the trainer's publish to an inference node's apply.

Runs the same workload on two code trees side by side, round-robin (each run a fresh interpreter
with that tree's ``pulse_node`` first on ``sys.path``): BEFORE, the package at ``--before``
(``git archive`` into a temporary directory; default 5d99364, two signature checks, two state
digests and three header parses per synced version, the reference codec on every publish) and
AFTER, this checkout (``VerifiedVersion``: one of each; ``chain.reference_size`` off). AFTER is
also run with ``chain.reference_size = true`` to separate the two effects.

Workload: a synthetic Adam-like BF16 chain (``tests/test_chain_synth.py``, ~1% of entries change
per version) of ``--params`` parameters, versions 0..``--versions`` with an anchor every 5. Phase
``publish``: the real ``VersionPublisher`` into a fresh store. Phase ``sync``: the real
``VersionSync`` over the in-memory transport, from version 0 to the head in one pass (patches,
two of them anchor versions). Per phase it reports seconds (min over ``--repeat`` runs) and how
often the three checks ran (``verify_signature`` on version records, ``state_hash``,
``unpack_header``; counted by wrapping them in every module that imported them).

Run: ``python bench/verify_once.py`` (about 2 minutes on 2 busy cores). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r'''
import json, sys, tempfile, time
from collections import Counter
from pathlib import Path
sys.path.insert(0, {tests!r})
import numpy as np
from test_chain_synth import TRAINER, adam_like_chain
from pulse_node.chain import identity as identity_mod
from pulse_node.codec import header as header_mod, statehash as statehash_mod
from pulse_node.net.wire.serving import store_resolver
from pulse_node.chain.store import VersionStore
try:  # the peer book (issue 31); before it, the trust policy
    from pulse_node.peers.book import PeerBook as TrustPolicy
    from pulse_node.peers.trainerset import TrainerSet
except ImportError:
    from pulse_node.chain.trainerset import TrainerSet
    from pulse_node.chain.trust import TrustPolicy
from pulse_node.config import ChainConfig, NetConfig
from pulse_node.chain.identity import Identity
from pulse_node.inference.syncer import VersionSync
try:
    from pulse_node.net.dht.records import PeerStatus, Serves
except ImportError:  # before the net/ split
    from pulse_node.net.dht_records import PeerStatus, Serves
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.publisher import VersionPublisher

counts = Counter()
def wrap(fn, label, only=None):
    def counted(*a, **k):
        if only is None or only(*a, **k):
            counts[label] += 1
        return fn(*a, **k)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("pulse_node") and getattr(mod, fn.__name__, None) is fn:
            setattr(mod, fn.__name__, counted)
wrap(identity_mod.verify_signature, "signature", lambda key, data, sig: bytes(data).startswith(b"pulse/version-record/"))
wrap(statehash_mod.state_hash, "state_hash")
wrap(header_mod.unpack_header, "header")

from pulse_node.codec.warmup import warm_up
warm_up()  # the codec's kernels compiled (or loaded from numba's cache) before anything is timed
n = {params}
shapes = {{"model.a.weight": (n // 2048, 1024), "model.b.weight": (n // 2048, 1024), "model.norm.weight": (1024,)}}
states = adam_like_chain(7, {versions}, shapes=shapes)
chain_cfg = ChainConfig(anchor_every=5, keep_versions=1000, **{extra})

def put_genesis(store, record, state):
    try:
        from pulse_node.chain.verified import verify_version
    except ImportError:
        store.put_anchor(record, state)
    else:
        store.put_anchor(verify_version(record, run_id=record.run_id, trusted_signers=None, state=state))

with tempfile.TemporaryDirectory() as tmp:
    hub = MemoryHub()
    trainer = VersionStore(Path(tmp) / "trainer")
    pub = VersionPublisher(trainer, TRAINER, run_id="bench", chain=chain_cfg)
    genesis = pub.publish(states[0]).record
    counts.clear()
    t0 = time.perf_counter()
    for s in states[1:]:
        pub.publish(s)
    publish_s, publish_counts = time.perf_counter() - t0, dict(counts)
    head = trainer.head()
    hub.join(peer_id(TRAINER), store_resolver(trainer.root)).publish(PeerStatus(
        role="trainer", version=head.version, node_key=TRAINER.public_key_hex,
        serves=Serves(lowest=1, highest=head.version, anchors=trainer.anchors())))
    me = Identity.generate()
    store = VersionStore(Path(tmp) / "inference")
    put_genesis(store, genesis, states[0])
    sync = VersionSync(store, hub.join(peer_id(me), lambda request: None),
                       TrustPolicy(TrainerSet(run_id="bench", keys=[TRAINER.public_key_hex])), net=NetConfig(),
                       catchup_min_gap=0, window=64)
    counts.clear()
    t0 = time.perf_counter()
    applied = sync.step(list(hub.records.values()))
    sync_s, sync_counts = time.perf_counter() - t0, dict(counts)
    assert len(applied) == {versions} and sync.record.state_hash == head.state_hash, "sync did not reach the head"
    sync.close(); store.close(); trainer.close()
print(json.dumps({{"publish_s": publish_s, "sync_s": sync_s, "publish_counts": publish_counts,
                  "sync_counts": sync_counts}}))
'''


def _run(tree: Path, *, params: int, versions: int, extra: str) -> dict:
    code = _CHILD.format(tests=str(ROOT / "tests"), params=params, versions=versions, extra=extra)
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="5d99364", help="git revision of the BEFORE tree")
    p.add_argument("--params", type=int, default=4 << 20, help="parameters of the synthetic model")
    p.add_argument("--versions", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "pulse_node"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        trees = {"before": (before, "{}"), "after": (ROOT, "{}"),
                 "after+reference": (ROOT, "{'reference_size': True}")}
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for name, (tree, extra) in trees.items():
                r = _run(tree, params=args.params, versions=args.versions, extra=extra)
                b = best.setdefault(name, r)
                b["publish_s"], b["sync_s"] = min(b["publish_s"], r["publish_s"]), min(b["sync_s"], r["sync_s"])
    v = args.versions
    for name, r in best.items():
        print(f"{name:16s} publish {r['publish_s'] / v * 1e3:7.1f} ms/version  sync {r['sync_s'] / v * 1e3:7.1f} "
              f"ms/version  | checks over {v} versions: publish {r['publish_counts']}  sync {r['sync_counts']}")
    ratios = {"publish_before_over_after": round(best["before"]["publish_s"] / best["after"]["publish_s"], 2),
              "sync_before_over_after": round(best["before"]["sync_s"] / best["after"]["sync_s"], 2),
              "publish_reference_over_after": round(best["after+reference"]["publish_s"] / best["after"]["publish_s"], 2)}
    print(f"ratios: {ratios}")
    print(json.dumps({"params": args.params, "versions": v, "before": args.before, **ratios,
                      **dict(best.items())}))


if __name__ == "__main__":
    main()
