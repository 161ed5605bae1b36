"""A version from its first byte to the live model ready to sample, at 166 M and ~1 B parameters.

    sudo python bench/sync_1b.py [--sizes 166m 1b] [--rates 100mbit 1gbit 10gbit] [--versions 4]

Per size: a store (anchor 0 plus ``--versions`` compact patches of emulated AdamW-like steps at
lr 3e-6, ``bench/emulated_steps.py``), then two parts.

- ``local`` (one process, no network; before/after side by side on the same patches): the old
  path (``apply_patch`` builds a new state, verified, then ``torchbits.load_state`` reloads every
  parameter of the FP32 live model) and the new one (``apply_patch_inplace`` into the state held,
  verified, then ``LiveWeights`` scatters the changed entries into the live model). With the
  steps kept (``keep=4``, the verifier's setting) it then moves the live model back 4 versions
  and forward again (undo/redo, no decode), and once onto an unseen state by a bitwise compare.
- ``link`` per rate: a trainer side serving the store and an inference side (the new path,
  ``keep=0`` as ``inference/role.py`` sets it) in two network namespaces joined by a veth pair,
  shaped with ``tc tbf`` at 100 Mbit and 1 Gbit, unshaped for "10gbit" (a veth moves several
  Gbit/s, bounded by the CPU). Per version: record fetch + signature check, patch transfer,
  record digest check, decode + in-place apply, state hash of the result, live-model update;
  and the peak RSS of the inference side during the versions (``VmHWM`` reset after start-up)
  minus its live model and minus the process before the model existed (interpreter + torch).
  Each version goes over the link twice, side by side on the same load: today's path (the whole
  patch, then digest, apply, hash, live update) and the pipelined one (``inference/streaming.py``:
  each tensor decoded, written into the live model and hashed as its section arrives), alternating
  which goes first (the first is undone in state and live model). ``--no-local`` skips ``local``.

Both the link client and ``--paced`` set the node's memory policy (``pulse_node/sysmem.py``);
``SYNC1B_HEAP=1`` leaves glibc's default, for the comparison.
``--paced`` adds, per rate, the pipelined path fed by a file this process writes at the rate:
what the pipeline alone leaves after the last byte, with no wire worker sharing the cores.
``--device cuda`` puts the live model (FP32 parameters) on the GPU in both parts; the state, the
decode and the hash stay on the CPU, as in an inference node sampling on a GPU.

Namespaces and veths (``pulse-syA``/``pulse-syB``, 10.231.78.0/30) are removed at the end, also
on error. Last line JSON: ``overhead_s`` (size -> rate -> mean seconds from the last byte of a
patch to the live model ready, today's path), ``overhead_pipelined_s`` (the same, pipelined),
``pipelined_vs_today`` (their ratio), ``load_avg``, ``peak_rss_per_param`` (size -> rate -> bytes per parameter
above the live model), ``switch_vs_apply`` (size -> moving the verifier back 4 versions / one
verified in-place apply), plus every phase.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.netns_link import RATES, VethPair  # noqa: E402

LINK = VethPair("pulse-syA", "pulse-syB", "psyA0", "psyB0", "10.231.78.1", "10.231.78.2")


def rss_kb(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def build_store(store: Path, *, size: str, versions: int) -> dict:
    """Anchor 0 plus ``versions`` patches, signed; only anchor 0 is stored whole."""
    from bench.emulated_steps import states
    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import make_record
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.statehash import state_hash
    from pulse_node.codec.warmup import warm_up

    warm_up()
    ident = Identity.generate()
    info: dict = {"signer": ident.public_key_hex, "patch_bytes": [], "changed": []}
    from pulse_node.chain.verified import verify_version

    def verified(rec, patch=None, *, state=None):  # the gate's checks, as a node receiving it runs them
        return verify_version(rec, run_id=rec.run_id, trusted_signers=None, patch=patch, state=state)

    with VersionStore(store) as vs:
        prev = prev_rec = prev_hash = None
        for step, state in states(size=size, lr=3e-6, steps=versions, emulate=True):
            h = state_hash(state)
            patch = make_patch(prev, state, base_hash=prev_hash, new_hash=h) if prev is not None else None
            rec = make_record(ident, run_id="sync1b", version=step, parent=prev_rec, state_hash=h, patch=patch,
                              anchor_version=0, is_anchor=step == 0,
                              codec="pulsesync/compact/1" if patch else "anchor/safetensors")
            if patch is None:
                vs.put_anchor(verified(rec, state=state))
                info["params"] = sum(t.numel for t in state.values())
            else:
                vs.put_patch(verified(rec, patch))
                info["patch_bytes"].append(len(patch))
                info["changed"].append(sum(int((state[k].bits != prev[k].bits).sum()) for k in state))
            print(f"  built v{step}" + (f": patch {len(patch) / 1e6:.2f} MB" if patch else ""), flush=True)
            prev, prev_rec, prev_hash = state, rec, h
    return info


def _built(store: Path, *, size: str, versions: int) -> dict:
    """The store of ``size`` (built, or reused from ``--store-dir`` when it holds the versions)."""
    meta = store.parent / f"{store.name}.json"
    if meta.exists() and json.loads(meta.read_text()).get("versions") == versions:
        print(f"  reusing {store}", flush=True)
        return json.loads(meta.read_text())
    shutil.rmtree(store, ignore_errors=True)
    info = build_store(store, size=size, versions=versions)
    info["versions"] = versions
    if store.parent.is_dir():
        meta.write_text(json.dumps(info))
    return info


def _live_params(state, device: str) -> dict:
    import torch

    return {name: torch.empty(t.shape, dtype=torch.float32, device=device) for name, t in state.items()}


def _node_memory() -> None:
    """The memory policy a node sets at start (``daemon/runtime.py``), unless ``SYNC1B_HEAP=1``."""
    from pulse_node.sysmem import return_large_frees

    if os.environ.get("SYNC1B_HEAP") != "1":
        return_large_frees()


def _sync_live(live) -> None:
    """Wait for the writes into ``live``'s parameters (see ``_sync``)."""
    _sync(str(next(iter(live.params.values())).device))


def _sync(device: str) -> None:
    """Wait for the live model's writes (CUDA copies and scatters are asynchronous)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def local(store: Path, versions: int, *, rounds: int = 3, device: str = "cpu") -> dict:
    """Old vs new path on the same patches, then the verifier's switch back 4 versions."""
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.inplace import apply_patch_inplace
    from pulse_node.codec.patch import apply_patch
    from pulse_node.codec.statehash import state_hash
    from pulse_node.codec.warmup import warm_up
    from pulse_node.rl.liveweights import LiveWeights
    from pulse_node.torchbits import load_state

    warm_up()
    vs = VersionStore(store, readonly=True)
    state = vs.anchor_state(0)
    live = LiveWeights(_live_params(state, device), keep=4)
    live.load(state, 0)
    _sync(device)
    rows = []
    for v in range(1, versions + 1):
        patch, base_hash = vs.patch_bytes(v), vs.record(v - 1).state_hash
        t0 = time.perf_counter()
        new = apply_patch(state, patch, verify=True, base_hash=base_hash)
        t1 = time.perf_counter()
        load_state(live.params, new)
        _sync(device)
        t2 = time.perf_counter()
        del new
        gc.collect()
        t3 = time.perf_counter()
        changes = apply_patch_inplace(state, patch, verify=False, base_hash=base_hash)
        t4 = time.perf_counter()
        assert state_hash(state) == vs.record(v).state_hash
        t5 = time.perf_counter()
        live.set(state, v, changes=[(v - 1, v, changes)])
        _sync(device)
        t6 = time.perf_counter()
        rows.append({"old_apply_verify_s": t1 - t0, "old_reload_s": t2 - t1, "old_total_s": t2 - t0,
                     "new_decode_apply_s": t4 - t3, "new_hash_s": t5 - t4, "new_live_update_s": t6 - t5,
                     "new_total_s": t6 - t3, "changed": changes.changed, "step_bytes": changes.nbytes})
        print(f"  local v{v}: {rows[-1]}", flush=True)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    back = max(0, versions - 4)
    # side by side, ``rounds`` times (min of each, so a load spike on the shared box spoils neither):
    # the verifier back 4 versions and forward again, and one verified in-place apply of the last patch
    last, base_hash = vs.patch_bytes(versions), vs.record(versions - 1).state_hash
    times: dict[str, list[float]] = {"back": [], "forward": [], "apply": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        assert live.move_to(back)
        _sync(device)
        t1 = time.perf_counter()
        assert live.move_to(versions)
        _sync(device)
        t2 = time.perf_counter()
        changes.undo(state)  # the state back at versions - 1, then the patch again, verified
        t3 = time.perf_counter()
        changes = apply_patch_inplace(state, last, verify=True, base_hash=base_hash)
        t4 = time.perf_counter()
        for k, dt in (("back", t1 - t0), ("forward", t2 - t1), ("apply", t4 - t3)):
            times[k].append(dt)
    foreign = {k: t.copy() for k, t in state.items()}  # the same version, another object: compared
    t0 = time.perf_counter()
    how = live.set(foreign, versions)
    _sync(device)
    diff = time.perf_counter() - t0
    best = {k: min(v) for k, v in times.items()}
    return {"versions": rows, "mean": mean, "switch_back_s": best["back"], "switch_forward_s": best["forward"],
            "apply_verified_s": best["apply"], "rounds": times, "steps_moved": versions - back,
            "first_visit_diff_s": diff, "first_visit": how, "switch_vs_apply": best["back"] / best["apply"],
            "old_vs_new_total": mean["old_total_s"] / mean["new_total_s"]}


def _today(wire, peer: str, work: Path, v: int, rec, state, live, base_hash: str):
    """Today's path: the whole patch, its digest, the in-place apply, the hash, the live scatter."""
    from pulse_node.chain.record import check_patch
    from pulse_node.codec.inplace import apply_patch_inplace
    from pulse_node.codec.statehash import state_hash
    from pulse_node.net.wire.protocol import PatchRequest

    t1 = time.monotonic()
    wire.fetch(peer, PatchRequest(version=v), work / f"{v}.patch", timeout=600)
    t2 = time.monotonic()  # the last byte is in
    patch = (work / f"{v}.patch").read_bytes()
    (work / f"{v}.patch").unlink()
    check_patch(rec, patch)  # the signed digest covers the payload
    t3 = time.monotonic()
    changes = apply_patch_inplace(state, patch, verify=False, base_hash=base_hash)
    t4 = time.monotonic()
    if state_hash(state) != rec.state_hash:  # what verify=True does, timed apart
        changes.undo(state)
        raise RuntimeError(f"v{v}: result hash differs from the signed one")
    t5 = time.monotonic()
    live.set(state, v, changes=[(v - 1, v, changes)])
    _sync_live(live)
    t6 = time.monotonic()
    return changes, {"transfer_s": t2 - t1, "digest_s": t3 - t2, "decode_apply_s": t4 - t3, "hash_s": t5 - t4,
                     "live_update_s": t6 - t5, "last_byte_to_ready_s": t6 - t2}


def _over_wire(wire, peer: str, v: int):
    """``fetch(dest)``: version ``v``'s patch from ``peer`` over the wire worker."""
    from pulse_node.net.wire.protocol import PatchRequest

    return lambda dest: wire.fetch(peer, PatchRequest(version=v), dest, timeout=600)


def _paced_writer(patch: bytes, rate: float, chunk: int = 1 << 16):
    """``fetch(dest)``: ``patch`` written into ``dest`` at ``rate`` bytes/s (a link without a wire worker)."""

    def fetch(dest: Path) -> None:
        t0 = time.monotonic()
        with open(dest, "wb") as f:
            for off in range(0, len(patch), chunk):
                f.write(patch[off:off + chunk])
                f.flush()
                ahead = t0 + min(len(patch), off + chunk) / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    return fetch


def _pipelined(fetch_to, work: Path, v: int, rec, state, live, base_hash: str, *, workers: int = 2):
    """The pipelined path (``inference/streaming.py``): applied while the file grows; not committed."""
    from pulse_node.codec.pipelined import Expected
    from pulse_node.inference.streaming import Pipeline

    done: dict[str, float] = {}

    def fetch(dest: Path) -> None:
        fetch_to(dest)
        done["t"] = time.monotonic()

    dest = work / f"{v}.p.patch"
    trace: list[tuple[str, str, float]] = []
    t1 = time.monotonic()
    _, streamed = Pipeline(live, trace=trace, workers=workers).fetch_apply(fetch, dest, state=state, base=v - 1,
                                                                            target=v,
                                             expected=Expected(base_hash, rec.state_hash, rec.patch_digest),
                                             size=rec.patch_bytes, timeout=600)
    _sync_live(live)
    t_ready = time.monotonic()
    dest.unlink(missing_ok=True)
    assert streamed is not None and streamed.live_written, "the pipelined path fell back"
    last = done["t"]
    ends = {ev: max((t for e, _, t in trace if e == ev), default=last) for ev in ("arrived", "decoded", "hashed")}
    left = [name for e, name, t in trace if e == "decoded" and t > last]
    changed = {name: c.idx.size for name, c in streamed.changes.tensors.items()}
    return streamed, {"transfer_s": last - t1, "last_byte_to_ready_s": t_ready - last,
                      "follower_last_byte_to_ready_s": t_ready - (streamed.last_byte_at or t_ready),
                      # after the last byte: when the last section was complete, decoded, hashed
                      "arrived_after_s": ends["arrived"] - last, "decoded_after_s": ends["decoded"] - last,
                      "hashed_after_s": ends["hashed"] - last,
                      "changes_left_at_last_byte": sum(changed.get(n, 0) for n in left) / max(1, sum(changed.values()))}


def client(peer: str, store: Path, work: Path, signer: str, versions: int, device: str = "cpu") -> dict:
    """Inference side, per version: today's path and the pipelined one side by side (alternating
    which goes first; the first is undone in state and live model), every phase timed; peak RSS
    above the live model."""
    import torch  # noqa: F401  (part of the process before the model: the baseline)

    from pulse_node.chain.record import decode_record, verify_record
    from pulse_node.codec.state import load_safetensors
    from pulse_node.codec.statehash import state_hash
    from pulse_node.codec.warmup import warm_up
    from pulse_node.net.wire import protocol as wp
    from pulse_node.net.wire.client import WireClient, WireConfig
    from pulse_node.rl.liveweights import LiveWeights

    warm_up()
    _node_memory()
    out: dict = {"phases": []}
    with WireClient.start(WireConfig(store=work, listen=[f"/ip4/{LINK.ip_b}/tcp/0"])) as wire:
        wire.fetch(peer, wp.RecordRequest(version=0), work / "warm.rec", timeout=60)  # connection set-up
        gc.collect()
        out["baseline_rss_kb"] = rss_kb()
        state = load_safetensors(store / "anchors" / "0.safetensors")  # we hold version 0
        live = LiveWeights(_live_params(state, device), keep=1)  # 1 (role: 0): the first path is undone by a step back
        live.load(state, 0)
        base_hash = state_hash(state)
        gc.collect()
        out["loaded_rss_kb"] = rss_kb()
        live_bytes = sum(p.numel() * p.element_size() for p in live.params.values())
        out["live_bytes"] = live_bytes if device == "cpu" else 0  # a CUDA live model is not in the RSS
        out["live_device_bytes"] = live_bytes if device != "cpu" else 0
        reset_peak()
        for v in range(1, versions + 1):
            t0 = time.monotonic()
            wire.fetch(peer, wp.RecordRequest(version=v), work / f"{v}.rec", timeout=120)
            rec = decode_record((work / f"{v}.rec").read_bytes())
            verify_record(rec, run_id="sync1b", trusted_signers=[signer])
            t1 = time.monotonic()
            # the first path's undo log is dropped before the second runs, so the peak RSS is one path's
            if v % 2:  # today's path first, undone, then the pipelined one (kept)
                changes, row = _today(wire, peer, work, v, rec, state, live, base_hash)
                changes.undo(state)
                assert live.move_to(v - 1, state)
                live.steps.clear()  # as the role (keep=0) holds no step
                del changes
                gc.collect()
                streamed, pipe = _pipelined(_over_wire(wire, peer, v), work, v, rec, state, live, base_hash)
                streamed.commit()
                live.steps.clear()
                del streamed
            else:  # the pipelined path first, undone, then today's (kept)
                streamed, pipe = _pipelined(_over_wire(wire, peer, v), work, v, rec, state, live, base_hash)
                streamed.rollback()
                del streamed
                gc.collect()
                changes, row = _today(wire, peer, work, v, rec, state, live, base_hash)
                live.steps.clear()
                del changes
            assert state_hash(state) == rec.state_hash and live.version == v
            base_hash = rec.state_hash
            out["phases"].append({"record_s": t1 - t0, **row, "total_s": row["transfer_s"] + row[
                "last_byte_to_ready_s"], "patch_bytes": rec.patch_bytes, "first": "today" if v % 2 else "pipelined",
                **{f"pipelined_{k}": x for k, x in pipe.items()}})
            print(f"v{v}: {out['phases'][-1]}", file=sys.stderr, flush=True)
        out["peak_rss_kb"] = rss_kb("VmHWM")
        out["load_avg"] = os.getloadavg()
        out["params"] = sum(t.numel for t in state.values())
    return out


def paced(store: Path, versions: int, rates: list[str], *, device: str = "cpu", workers: int = 2) -> dict:
    """The pipelined path fed by a file written at each rate in this process: what the pipeline
    alone leaves after the last byte, without a wire worker beside it (no root needed). Each
    version is streamed once per rate on the same state (undone between rates)."""
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.warmup import warm_up
    from pulse_node.rl.liveweights import LiveWeights

    warm_up()
    _node_memory()
    vs = VersionStore(store, readonly=True)
    state = vs.anchor_state(0)
    live = LiveWeights(_live_params(state, device), keep=1)
    live.load(state, 0)
    rows: dict[str, list[dict]] = {r: [] for r in rates}
    with tempfile.TemporaryDirectory(prefix="pulse-sync1b-paced-") as tmp:
        for v in range(1, versions + 1):
            rec, patch, base_hash = vs.record(v), vs.patch_bytes(v), vs.record(v - 1).state_hash
            for i, rate in enumerate(rates):
                gc.collect()
                streamed, row = _pipelined(_paced_writer(patch, RATES[rate]), Path(tmp), v, rec, state, live,
                                           base_hash, workers=workers)
                (Path(tmp) / f"{v}.p.patch").unlink(missing_ok=True)
                streamed.commit() if i == len(rates) - 1 else streamed.rollback()
                live.steps.clear()
                del streamed
                rows[rate].append(row)
                print(f"  paced v{v} {rate}: {row}", flush=True)
    return {rate: {"mean": {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}, "versions": rs,
                   "ideal_transfer_s": vs.record(1).patch_bytes / RATES[rate]} for rate, rs in rows.items()}


def link(rate: str, store: Path, info: dict, versions: int, device: str = "cpu") -> dict:
    out = LINK.run_pair(Path(__file__).resolve(), rate, store, [info["signer"], str(versions), device],
                        start_timeout=600, timeout=3600)
    phases = out["phases"]
    mean = {k: sum(p[k] for p in phases) / len(phases) for k in phases[0] if isinstance(phases[0][k], (int, float))}
    above = out["peak_rss_kb"] * 1024 - out["live_bytes"] - out["baseline_rss_kb"] * 1024
    return {"rate": rate, "mean": mean, "phases": phases, "ideal_transfer_s": mean["patch_bytes"] / RATES[rate],
            "load_avg": out["load_avg"],
            "pipelined_vs_today": mean["pipelined_last_byte_to_ready_s"] / mean["last_byte_to_ready_s"],
            "peak_rss_per_param": above / out["params"],
            "peak_rss_per_param_with_runtime": (out["peak_rss_kb"] * 1024 - out["live_bytes"]) / out["params"],
            "held_rss_per_param": (out["loaded_rss_kb"] - out["baseline_rss_kb"]) * 1024 / out["params"]
            - out["live_bytes"] / out["params"],  # the state (and load residue) before any version
            "version_peak_per_param": (out["peak_rss_kb"] - out["loaded_rss_kb"]) * 1024 / out["params"],
            "baseline_rss_mb": out["baseline_rss_kb"] / 1024, "peak_rss_mb": out["peak_rss_kb"] / 1024,
            "loaded_rss_mb": out["loaded_rss_kb"] / 1024, "live_mb": out["live_bytes"] / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["166m", "1b"], choices=["34m", "166m", "1b"])
    ap.add_argument("--rates", nargs="+", default=list(RATES), choices=list(RATES))
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--no-link", action="store_true", help="only the local part (no root needed)")
    ap.add_argument("--no-local", action="store_true", help="only the links (no old-vs-new reload comparison)")
    ap.add_argument("--store-dir", type=Path, help="keep the built stores here and reuse them (per size)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the side-by-side switch / apply timing")
    ap.add_argument("--serve", nargs=3, metavar=("STORE", "READY", "STOP"))
    ap.add_argument("--device", default="cpu", help="where the live model lives (cpu, cuda)")
    ap.add_argument("--paced", action="store_true",
                    help="also the pipelined path fed at each rate in-process (no wire worker, no root)")
    ap.add_argument("--workers", type=int, default=2, help="decode threads of the paced pipeline")
    ap.add_argument("--client", nargs=6, metavar=("PEER", "STORE", "WORK", "SIGNER", "VERSIONS", "DEVICE"))
    args = ap.parse_args()
    if args.serve:
        LINK.serve(Path(args.serve[0]), Path(args.serve[1]), Path(args.serve[2]))
        return
    if args.client:
        peer, store, work, signer, versions, device = args.client
        print(json.dumps(client(peer, Path(store), Path(work), signer, int(versions), device)))
        return
    if not args.no_link and os.geteuid() != 0:
        sys.exit("sync_1b needs root for its links (ip netns, tc); --no-link runs the local part only")
    report: dict = {"device": args.device, "overhead_s": {}, "overhead_pipelined_s": {}, "pipelined_vs_today": {}, "peak_rss_per_param": {},
                    "switch_vs_apply": {}, "load_avg": [], "sizes": {}}
    try:
        for size in args.sizes:
            with tempfile.TemporaryDirectory(prefix="pulse-sync1b-store-") as tmp:
                store = (args.store_dir / size) if args.store_dir else Path(tmp) / "store"
                info = _built(store, size=size, versions=args.versions)
                gc.collect()
                report["load_avg"].append(os.getloadavg())
                loc = {} if args.no_local else local(store, args.versions, rounds=args.rounds, device=args.device)
                gc.collect()
                if loc:
                    print(f"{size} local: old {loc['mean']['old_total_s']:.3f} s, new {loc['mean']['new_total_s']:.3f} s "
                          f"per version; back {loc['steps_moved']} versions {loc['switch_back_s']:.3f} s = "
                          f"{loc['switch_vs_apply']:.2f}x a verified apply ({loc['apply_verified_s']:.3f} s)", flush=True)
                pace = paced(store, args.versions, args.rates, device=args.device, workers=args.workers) \
                    if args.paced else {}
                for rate, r in pace.items():
                    print(f"{size} paced {rate}: last byte -> live model {r['mean']['last_byte_to_ready_s']:.3f} s "
                          f"(transfer {r['mean']['transfer_s']:.3f} s, ideal {r['ideal_transfer_s']:.3f} s; changes "
                          f"left at the last byte {r['mean']['changes_left_at_last_byte']:.0%})", flush=True)
                links = {} if args.no_link else {rate: link(rate, store, info, args.versions, args.device)
                                                 for rate in args.rates}
                for rate, r in links.items():
                    print(f"{size} {rate}: last byte -> live model {r['mean']['last_byte_to_ready_s']:.3f} s today, "
                          f"{r['mean']['pipelined_last_byte_to_ready_s']:.3f} s pipelined "
                          f"({r['pipelined_vs_today']:.3f}x, load {r['load_avg'][0]:.1f}); "
                          f"(transfer {r['mean']['transfer_s']:.3f} s, ideal {r['ideal_transfer_s']:.3f} s); "
                          f"peak RSS above live model {r['peak_rss_per_param']:.2f} B/param "
                          f"({r['peak_rss_per_param_with_runtime']:.2f} with the runtime); {r['mean']}", flush=True)
            report["sizes"][size] = {"params": info["params"], "patch_bytes": info["patch_bytes"],
                                     "bytes_per_change": sum(info["patch_bytes"]) / sum(info["changed"]),
                                     "changed_fraction": sum(info["changed"]) / len(info["changed"]) / info["params"],
                                     "local": loc, "links": links, "paced": pace}
            report["overhead_s"][size] = {r: v["mean"]["last_byte_to_ready_s"] for r, v in links.items()}
            if pace:
                report.setdefault("overhead_paced_s", {})[size] = {r: v["mean"]["last_byte_to_ready_s"]
                                                                   for r, v in pace.items()}
            report["peak_rss_per_param"][size] = {r: v["peak_rss_per_param"] for r, v in links.items()}
            report["overhead_pipelined_s"][size] = {r: v["mean"]["pipelined_last_byte_to_ready_s"]
                                                    for r, v in links.items()}
            report["pipelined_vs_today"][size] = {r: v["pipelined_vs_today"] for r, v in links.items()}
            if loc:
                report["switch_vs_apply"][size] = loc["switch_vs_apply"]
    finally:
        if not args.no_link:
            LINK.down()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
