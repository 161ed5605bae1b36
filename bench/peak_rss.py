"""Peak resident memory of each role's per-version work, one child process per role, in bytes per parameter.

The parent makes two consecutive versions at a preset size (``bench/emulated_steps.py`` or real
AdamW at small sizes) and writes them as safetensors files with the patch between them. Each
role then runs in a fresh process: imports, loads what the role holds between versions, then
does the per-version work while a thread samples its RSS every 2 ms:

- ``publisher`` (a trainer publishing a version): holds the previous and the new BF16 state;
  state hash of the new one, diff + encode of the compact patch, record signature.
- ``anchor`` (a trainer writing an anchor / a node saving its current state): holds one state;
  ``save_safetensors_atomic``.
- ``inference`` (an inference node applying a version): holds the base state and the patch;
  ``apply_patch`` with the payload digest and the result hash checked.

Reported per role: RSS after imports (base), held = RSS with the inputs loaded, peak during the
work; B/param of (held - base) and (peak - base). A trainer's optimizer and PULSELoCo state come
on top (bench/fsdp_memory.py). Last line: JSON.

    python bench/peak_rss.py --size 1b --emulate
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ROLES = ("publisher", "anchor", "inference")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Sampler:
    """Max RSS while the ``with`` block runs (a thread polling /proc/self/statm)."""

    def __enter__(self) -> Sampler:
        self.peak, self._stop = rss_mb(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def role(name: str, work: Path) -> dict:
    """One role in this (fresh) process: base, held and peak RSS in MB, seconds of the work."""
    import numpy as np  # noqa: F401

    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import make_record
    from pulse_node.codec.patch import apply_patch, make_patch
    from pulse_node.codec.state import load_safetensors, save_safetensors_atomic
    from pulse_node.codec.statehash import state_hash
    from pulse_node.codec.warmup import warm_up

    warm_up()
    ident = Identity.generate()
    meta = json.loads((work / "meta.json").read_text())
    base = rss_mb()
    if name == "publisher":
        prev, new = load_safetensors(work / "v0.safetensors"), load_safetensors(work / "v1.safetensors")
        held = rss_mb()
        t0 = time.perf_counter()
        with Sampler() as s:
            h = state_hash(new)
            patch = make_patch(prev, new, base_hash=meta["base_hash"], new_hash=h)
            make_record(ident, run_id="rss", version=1, parent=make_record(
                ident, run_id="rss", version=0, parent=None, state_hash=meta["base_hash"], patch=None,
                anchor_version=0, is_anchor=True, codec="anchor/safetensors"),
                state_hash=h, patch=patch, anchor_version=0, is_anchor=False, codec="pulsesync/compact/1")
    elif name == "anchor":
        new = load_safetensors(work / "v1.safetensors")
        held = rss_mb()
        t0 = time.perf_counter()
        with Sampler() as s:
            save_safetensors_atomic(new, work / "anchor-out.safetensors")
    else:
        prev, patch = load_safetensors(work / "v0.safetensors"), (work / "v1.patch").read_bytes()
        held = rss_mb()
        t0 = time.perf_counter()
        with Sampler() as s:
            out = apply_patch(prev, patch, verify=True, base_hash=meta["base_hash"])
        assert state_hash(out) == meta["new_hash"]
    return {"role": name, "base_mb": base, "held_mb": held, "peak_mb": s.peak, "seconds": time.perf_counter() - t0}


def prepare(work: Path, size: str, emulate: bool, lr: float) -> dict:
    """Two consecutive versions as safetensors files, the patch between them, their hashes."""
    from bench.emulated_steps import states
    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.state import save_safetensors_atomic
    from pulse_node.codec.statehash import state_hash

    prev = None
    for step, state in states(size=size, lr=lr, steps=1, emulate=emulate):
        save_safetensors_atomic(state, work / f"v{step}.safetensors")
        if prev is not None:
            bh, nh = state_hash(prev), state_hash(state)
            patch = make_patch(prev, state, base_hash=bh, new_hash=nh)
            (work / "v1.patch").write_bytes(patch)
            meta = {"params": sum(t.numel for t in state.values()), "patch_bytes": len(patch),
                    "base_hash": bh, "new_hash": nh}
        prev = state
    (work / "meta.json").write_text(json.dumps(meta))
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["34m", "166m", "1b"], default="34m")
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--lr", type=float, default=3e-6)
    ap.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        print(json.dumps(role(args.role, Path(args.work))))
        return
    with tempfile.TemporaryDirectory(prefix="pulse-rss-") as tmp:
        work = Path(tmp)
        meta = prepare(work, args.size, args.emulate, args.lr)
        n = meta["params"]
        rows = []
        print(f"{n / 1e6:.0f} M params, patch {meta['patch_bytes'] / 1e6:.2f} MB", flush=True)
        for name in ROLES:
            res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--role", name, "--work", str(work)],
                                 capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            r = json.loads(res.stdout.strip().splitlines()[-1])
            r["held_b_per_param"] = (r["held_mb"] - r["base_mb"]) * 2**20 / n
            r["peak_b_per_param"] = (r["peak_mb"] - r["base_mb"]) * 2**20 / n
            rows.append(r)
            print(f"{name:10s} base {r['base_mb']:7.0f} MB  held {r['held_mb']:7.0f} MB ({r['held_b_per_param']:.1f} B/param)"
                  f"  peak {r['peak_mb']:7.0f} MB ({r['peak_b_per_param']:.1f} B/param)  work {r['seconds']:.1f} s",
                  flush=True)
    print(json.dumps({"bench": "peak_rss", "size": args.size, "emulate": args.emulate, "params": n,
                      "patch_bytes": meta["patch_bytes"], "roles": rows}))


if __name__ == "__main__":
    main()
