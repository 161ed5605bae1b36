"""Walk one version and one LoCo payload through the code, before and after a change, and count the walk.

What a reader taking the code over follows: an inference node taking one pushed head and
applying that version (the view, the head, the record and patch fetched, verified, applied and
stored, the head pushed on), and two trainers agreeing on one PULSELoCo round (each payload
pushed, decided, gathered). Both run on the in-memory hub (``testing/memory.py``), so the two
worker processes are not walked. Every call between ``pulse_node`` functions is traced with
``sys.setprofile`` / ``threading.setprofile`` (comprehension frames count as their function's,
``pulse_node/testing`` is the network and is not counted). Per walk it reports:

- ``calls``: distinct caller -> callee edges between ``pulse_node`` functions (``calls_total``:
  every call, loops included);
- ``folders``: distinct folders the walk enters (``net`` counted by sub-folder);
- ``returns``: returns to a folder already left, on the reader's path: each function is read
  once, where the walk first reaches it; the folders of those functions in that order (per
  thread, repeats in a row merged) are the path, and every step of it into a folder that came
  earlier in it is a return;
- ``callbacks``: distinct call edges into a folder that is on the call stack below a frame of
  another folder (a lower layer calling back up);
- ``untyped``: distinct functions on the walk taking or returning an untyped form: a parameter
  or return annotated ``Any``, a bare ``dict``/``list``/``tuple``, ``dict[str, Any]``, or not
  annotated at all (``self``/``cls`` aside; lambdas and nested functions are not resolved).

The same scenario runs on two trees side by side (each in a fresh interpreter with that tree's
``pulse_node`` first on ``sys.path``): BEFORE, ``git archive`` of ``--before``, and AFTER, this
checkout; the set-up adapts to each tree's constructors, the walked calls are the same.

Run: ``python bench/walk.py [--before REV]`` (about 30 s). The last line is JSON.
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
import inspect, json, re, sys, tempfile, threading, time, types
from collections import Counter
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_chain_synth import TRAINER, adam_like_chain
import numpy as np
import pulse_node
from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerStatus, Serves
from pulse_node.chain.record import encode_record
from pulse_node.net.wire.serving import store_resolver
from pulse_node.chain.store import VersionStore
from pulse_node.config import ChainConfig, InferenceConfig, NetConfig, TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status import NodeStatus
from pulse_node.inference.syncer import VersionSync
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub
from pulse_node.trainer.agreement import RoundAgreement
from pulse_node.trainer.publisher import VersionPublisher
from pulse_node.codec.warmup import warm_up
warm_up()

PKG = Path(pulse_node.__file__).resolve().parent
SKIP = {{"<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>"}}

PREFIX = str(PKG) + "/"
FOLDERS = {{}}

def folder(path):
    """The folder of a ``pulse_node`` file (``net`` by sub-folder); None outside it or in testing/."""
    if not path.startswith(PREFIX):
        return None
    got = FOLDERS.get(path, False)
    if got is False:
        parts = Path(path).relative_to(PKG).parts
        got = None if parts[0] == "testing" else parts[0][:-3] if len(parts) == 1 else (
            "/".join(parts[:2]) if parts[0] == "net" else parts[0])
        FOLDERS[path] = got
    return got

class Walk:
    def __init__(self):
        self.edges, self.callbacks, self.funcs, self.total = set(), set(), {{}}, 0
        self.paths = {{}}  # thread -> folders of the functions it reached first, in order
        self.lock = threading.Lock()
    def _frames(self, frame):
        while frame is not None:
            f = folder(frame.f_code.co_filename)
            if f is not None and frame.f_code.co_name not in SKIP:
                yield f, frame
            frame = frame.f_back
    def profile(self, frame, event, arg):
        if event != "call" or folder(frame.f_code.co_filename) is None:
            return
        chain = list(self._frames(frame))
        if not chain or chain[0][1] is not frame:
            return
        (f, callee), rest = chain[0], chain[1:]
        key = (callee.f_code.co_filename, callee.f_code.co_qualname)
        with self.lock:
            self.total += 1
            if key not in self.funcs:
                self.funcs[key] = (f, callee.f_globals)
                path = self.paths.setdefault(threading.get_ident(), [])
                if not path or path[-1] != f:
                    path.append(f)
            if not rest:
                return
            caller = (rest[0][1].f_code.co_filename, rest[0][1].f_code.co_qualname)
            self.edges.add((caller, key))
            if rest[0][0] != f and f in [g for g, _ in rest[1:]]:
                self.callbacks.add((caller, key))
    def __enter__(self):
        threading.setprofile(self.profile); sys.setprofile(self.profile); return self
    def __exit__(self, *exc):
        sys.setprofile(None); threading.setprofile(None)
    def summary(self):
        untyped = sorted(f"{{Path(k[0]).relative_to(PKG)}}:{{k[1]}}" for k, (f, g) in self.funcs.items()
                         if untyped_form(k[1], g))
        folders = sorted({{f for f, _ in self.funcs.values()}})
        returns = sum(f in path[:i] for path in self.paths.values() for i, f in enumerate(path))
        return {{"calls": len(self.edges), "calls_total": self.total, "functions": len(self.funcs),
                "folders": len(folders), "folder_names": folders, "returns": returns,
                "paths": [" > ".join(p) for p in self.paths.values()], "callbacks": len(self.callbacks),
                "callback_edges": sorted(f"{{a[1]}} -> {{b[1]}}" for a, b in self.callbacks),
                "untyped": len(untyped), "untyped_functions": untyped}}

LOOSE = {{"Any", "dict", "list", "tuple", "dict[str, Any]", "Mapping[str, Any]"}}

def untyped_form(qualname, g):
    if "<" in qualname:
        return False
    obj = None
    for part in qualname.split("."):
        obj = g.get(part) if obj is None else getattr(obj, part, None)
        if obj is None:
            return False
    fn = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
    if not isinstance(fn, types.FunctionType):
        return False
    ann = fn.__annotations__
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]
    for p in params:
        a = ann.get(p.name)
        if loose(a):
            return True
    return loose(ann.get("return"))

def loose(a):
    return a is None or str(a).strip() in LOOSE or re.search(r"\bAny\b", str(a)) is not None

# ---- set-up: the one place the two trees differ ------------------------------------------
try:
    from pulse_node.peers.book import PeerBook  # after
except ImportError:
    PeerBook = None

def inference_node(tmp, hub, genesis_state, genesis):
    me = Identity.generate()
    cfg = InferenceConfig.model_validate({{"data_dir": str(tmp / "inf"), "run_id": "walk",
                                          "chain": {{"trusted_trainers": [TRAINER.public_key_hex]}}}})
    store = VersionStore(tmp / "inf" / "store")
    store.put_anchor(genesis)
    transport = hub.join(peer_id(me), store_resolver(store.root))
    ctx = RoleContext(cfg=cfg, identity=me, store=store, transport=transport,
                      status=NodeStatus(role="inference", peer_id=peer_id(me), run_id="walk"))
    return ctx, syncer_on(ctx)

def syncer_on(ctx):
    if PeerBook is None:
        from pulse_node.daemon.evidence_plane import node_trust
        trust = node_trust(ctx.cfg)
        trust.listen_members(ctx.share_members)
        return VersionSync(ctx.store, ctx.transport, trust, net=NetConfig(), catchup_min_gap=0, standing=ctx.standing)
    return VersionSync(ctx.store, ctx.transport, ctx.book, net=NetConfig(), catchup_min_gap=0)

def trainer_node(tmp, hub, ident, keys, shapes, base, weights):
    cfg = TrainerConfig.model_validate({{"data_dir": str(tmp / ident.public_key_hex[:8]), "run_id": "walk",
                                        "chain": {{"trusted_trainers": keys}}, "loco": {{"deadline_s": 5.0}}}})
    store = VersionStore(tmp / ident.public_key_hex[:8] / "store")
    transport = hub.join(peer_id(ident), store_resolver(store.root))
    transport.publish(PeerStatus(role="trainer", version=3, node_key=ident.public_key_hex))
    ctx = RoleContext(cfg=cfg, identity=ident, store=store, transport=transport,
                      status=NodeStatus(role="trainer", peer_id=peer_id(ident), run_id="walk"))
    epoch = {{"epoch": lambda: bytes(32)}} if "epoch" in inspect.signature(RoundAgreement).parameters else {{}}
    return RoundAgreement(ctx, shapes=shapes, current_round=lambda: 3, base=lambda: (base, weights), **epoch)

# ---- one version ---------------------------------------------------------------------------
def version_walk(tmp):
    from pulse_node.chain.verified import verify_version
    hub = MemoryHub()
    states = adam_like_chain(7, 3)
    trainer = VersionStore(tmp / "trainer")
    pub = VersionPublisher(trainer, TRAINER, run_id="walk", chain=ChainConfig(anchor_every=100))
    genesis = verify_version(pub.publish(states[0]).record, run_id="walk", trusted_signers=None, state=states[0])
    for s in states[1:]:
        pub.publish(s)
    head = trainer.head()
    hub.join(peer_id(TRAINER), store_resolver(trainer.root)).publish(PeerStatus(
        role="trainer", version=head.version - 1, node_key=TRAINER.public_key_hex,
        serves=Serves(lowest=1, highest=head.version, anchors=trainer.anchors())))
    ctx, first = inference_node(tmp, hub, states[0], genesis)
    first.step(ctx.peers())  # versions 1 and 2: the record the trainer announces is probed
    assert first.record.version == head.version - 1, first.record
    first.close()
    # a syncer on that store whose fetch threads start inside the walk (so they are traced too)
    sync = syncer_on(ctx)
    from pulse_node.daemon.transport import Event
    with Walk() as w:
        events = [Event("head", peer_id(TRAINER), encode_record(head), 0)]
        sync.take_events(events)
        peers = ctx.peers()
        applied = sync.step(peers)
        rec = sync.record
        ctx.announce(version=rec.version, chain_hash=rec.chain_hash, state_hash=rec.state_hash)
        ctx.push_in_background("head", encode_record(rec), ctx.peers("inference"))
        deadline = time.monotonic() + 10
        while ctx._fanout is not None and not ctx._fanout.idle() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [r.version for r in applied] == [head.version], applied
    sync.close(); ctx.close(); ctx.store.close(); trainer.close()
    return w.summary()

# ---- one LoCo round ------------------------------------------------------------------------
def loco_walk(tmp):
    hub = MemoryHub()
    shapes = {{"w": (64,)}}
    base = b"\x01" * 32
    weights = {{"w": (np.random.default_rng(0).standard_normal(64) * 0.02).astype(np.float32)}}
    a, b = Identity.generate(), Identity.generate()
    keys = [a.public_key_hex, b.public_key_hex]
    ags = [trainer_node(tmp, hub, i, keys, shapes, base, weights) for i in (a, b)]
    mine = []
    for ag in ags:
        p = LocoPayload(round=3, trainer_id=ag.me, base_hash=base, numel={{"w": 64}},
                        tensors={{"w": (np.array([1, 5, 9], np.int64), np.array([1e-4, -1e-4, 1e-4], np.float32))}})
        mine.append((p, encode_payload(p, base=weights)))
    results = {{}}
    with Walk() as w:
        for ag, (p, data) in zip(ags, mine):
            ag.open_round(p, data)
        deadline = time.monotonic() + 180  # traced calls are slow on a busy machine
        while len(results) < 2 and time.monotonic() < deadline:
            for ag in ags:
                if ag.me in results:
                    continue
                for ev in ag.ctx.transport.events(wait_s=0.01):
                    if ev.kind == "loco":
                        ag.offer_payload(ev.sender, ev.data)
                    elif ev.kind == "loco_decision":
                        ag.offer_decision(ev.sender, ev.data)
                r = ag.step()
                if r is not None:
                    results[ag.me] = r
        time.sleep(0.2)  # the background pushes end
    assert len(results) == 2 and all(r.payloads is not None and len(r.payloads) == 2 for r in results.values()), results
    for ag in ags:
        ag.ctx.close(); ag.ctx.store.close()
    return w.summary()

with tempfile.TemporaryDirectory() as tmp:
    out = {{"version": version_walk(Path(tmp) / "v"), "loco": loco_walk(Path(tmp) / "l")}}
print(json.dumps(out))
'''


def _run(tree: Path) -> dict:
    code = _CHILD.format(tests=str(ROOT / "tests"))
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="fe579b4", help="git revision of the BEFORE tree")
    p.add_argument("--verbose", action="store_true", help="also list the return edges and untyped functions")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "pulse_node"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        got = {"before": _run(before), "after": _run(ROOT)}
    keys = ("calls", "calls_total", "functions", "folders", "returns", "callbacks", "untyped")
    print(f"{'walk':8s} {'tree':7s} " + " ".join(f"{k:>11s}" for k in keys))
    for walk in ("version", "loco"):
        for tree in ("before", "after"):
            r = got[tree][walk]
            print(f"{walk:8s} {tree:7s} " + " ".join(f"{r[k]:>11d}" for k in keys))
            if args.verbose:
                print("   folders:", " ".join(r["folder_names"]))
                for path in r["paths"]:
                    print("   path:", path)
                for e in r["callback_edges"]:
                    print("   callback:", e)
                for f in r["untyped_functions"]:
                    print("   untyped:", f)
    print(json.dumps({"before": args.before, **{t: {w: {k: got[t][w][k] for k in keys} for w in got[t]}
                                                for t in got}}))


if __name__ == "__main__":
    main()
