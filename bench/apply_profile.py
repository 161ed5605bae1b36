"""Where one version's apply spends its time, per changed entry, on one thread.

    python bench/apply_profile.py --store /tmp/stores/1b [--version 1] [--chunk 262144]

Reads a store that ``bench/sync_1b.py --store-dir`` built (anchor 0 and its patches), decodes
every changed tensor of ``--version`` into the anchor's arrays step by step, and prints ns per
changed entry for each step of ``codec/inplace.py``'s apply (split, position classes, positions
decoded straight into 4-byte indices, the value kernel with its undo/redo arrays), then the
compiled live-model write (``kernels.scatter_shifted`` into FP32 words) against numpy's fancy
assignment, a tensor's whole apply with and without the live words written in the kernel's own
pass (``_patch_tensor(..., live=)``, the pipeline's CPU path), and last,
side by side, decode-then-hash each whole tensor against hashing each chunk right behind its
decode (what a state hash over per-tensor digests would allow). Every step is undone before the
next. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _tensors(store: Path, version: int):
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec import patch as P
    from pulse_node.codec.inplace import apply_patch_inplace
    from pulse_node.codec.models import PatchModels

    vs = VersionStore(store, readonly=True)
    state = vs.anchor_state(0)
    for v in range(1, version):  # the versions before, in place
        apply_patch_inplace(state, vs.patch_bytes(v), verify=False)
    parsed = P.parse_patch(vs.patch_bytes(version))
    payload = memoryview(parsed.data)[parsed.start:]
    models = PatchModels({(t.coding, t.dtype, t.label): t.counts for t in parsed.header.tables})
    return state, [e for e in parsed.header.tensors if e.changed], payload, models


def steps(state, entries, payload, models) -> dict:
    """Seconds per step of the in-place apply, summed over the tensors (undone after each)."""
    import numpy as np

    from pulse_node.codec import patch as P
    from pulse_node.codec.context import position_classes
    from pulse_node.codec.positions import decode_positions, index_dtype

    t = dict.fromkeys(("split", "classes", "positions", "values"), 0.0)
    for e in entries:
        tb = state[e.name]
        t0 = time.perf_counter()
        pos_blob, words, raw = P._split_stream(payload[e.offset:e.offset + e.length], e.name)
        t1 = time.perf_counter()
        classes = position_classes(e.dtype, tb.bits, e.threshold)
        t2 = time.perf_counter()
        idx = decode_positions(pos_blob, e.numel, max_count=e.changed, classes=classes,
                               dtype=index_dtype(e.numel))
        t3 = time.perf_counter()
        old, new = np.empty(idx.size, tb.bits.dtype), np.empty(idx.size, tb.bits.dtype)
        P._decode_deltas(e, idx, words, raw, models, tb.bits, old=old, new=new)
        t4 = time.perf_counter()
        tb.bits[idx] = old
        for k, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            t[k] += dt
    return t


def live_writes(state, entries, payload, models) -> dict:
    """The FP32 live model written with every change: compiled scatter vs numpy fancy assignment."""
    import numpy as np

    from pulse_node.codec import kernels as K
    from pulse_node.codec.inplace import _patch_tensor

    changes = {e.name: _patch_tensor(e, state[e.name], payload, models) for e in entries}
    words = {n: np.ones(state[n].numel, np.uint32) for n in changes}  # pages touched before timing
    out: dict[str, float] = {}
    ways = (("numpy", lambda w, c: w.__setitem__(c.idx, c.new.astype(np.uint32) << 16)),
            ("compiled", lambda w, c: K.scatter_shifted(w, c.idx, c.new, 16)))
    for _ in range(2):  # alternating, the best of two each
        for name, fn in ways:
            t0 = time.perf_counter()
            for n, c in changes.items():
                fn(words[n], c)
            out[name] = min(out.get(name, float("inf")), time.perf_counter() - t0)
    for n, c in changes.items():
        state[n].bits[c.idx] = c.old
    for _ in range(2):  # the whole tensor apply, with the live words written in the kernel's pass or not
        for name, live in (("apply", False), ("apply_with_live", True)):
            t = 0.0
            for e in entries:
                t0 = time.perf_counter()
                c = _patch_tensor(e, state[e.name], payload, models, live=(words[e.name], 16) if live else None)
                t += time.perf_counter() - t0
                state[e.name].bits[c.idx] = c.old
            out[name] = min(out.get(name, float("inf")), t)
    return out


def hash_order(state, entries, payload, models, chunk: int) -> dict:
    """Decode then BLAKE3 each whole tensor, against BLAKE3 of each chunk right behind its decode."""
    import blake3
    import numpy as np

    from pulse_node.codec import patch as P
    from pulse_node.codec import values as V
    from pulse_node.codec.entropy import bin_bounds
    from pulse_node.codec.fused import RawBits, decode_deltas_into

    out = {}
    for mode in ("whole", "chunked"):
        total = 0.0
        for e in entries:
            tb = state[e.name]
            pos_blob, words, raw_b = P._split_stream(payload[e.offset:e.offset + e.length], e.name)
            idx = P._decode_positions(e, tb.bits, pos_blob)
            old, new = np.empty(idx.size, tb.bits.dtype), np.empty(idx.size, tb.bits.dtype)
            label_row, stack = models.delta_stack(e.dtype, e.name)
            dec, raw = P.AnsDecoder(words), RawBits(raw_b)
            low, nextra = bin_bounds(P.MAX_BINS)
            _kind, mant, emask = V.label_layout(e.dtype)
            flat = tb.bits.reshape(-1)
            t0 = time.perf_counter()
            h = blake3.blake3(max_threads=1)
            cuts = list(np.searchsorted(idx, np.arange(chunk, tb.numel, chunk))) + [idx.size] \
                if mode == "chunked" else [idx.size]
            s = a = 0
            for k, c in enumerate(cuts):
                decode_deltas_into(dec, raw, label_row, stack, idx[s:c], flat, V.kind_of(e.dtype), mant, emask, low, nextra,
                                   old=old[s:c], new=new[s:c])
                b = tb.numel if c == idx.size else min(tb.numel, (k + 1) * chunk)
                h.update(flat[a:b].view(np.uint8).data)
                s, a = c, b
            h.digest()
            total += time.perf_counter() - t0
            flat[idx] = old
        out[mode] = total
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="a store bench/sync_1b.py built (e.g. /tmp/stores/1b)")
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=1 << 18, help="elements per chunk of the chunked hash")
    args = ap.parse_args()
    from pulse_node.codec.warmup import warm_up

    warm_up()
    state, entries, payload, models = _tensors(args.store, args.version)
    n = sum(e.changed for e in entries)
    per = {k: v / n * 1e9 for k, v in steps(state, entries, payload, models).items()}
    live = {k: v / n * 1e9 for k, v in live_writes(state, entries, payload, models).items()}
    hashed = hash_order(state, entries, payload, models, args.chunk)
    print(f"{n / 1e6:.1f} M changes in {len(entries)} tensors; ns per change: "
          + ", ".join(f"{k} {v:.1f}" for k, v in per.items()) + f" (total {sum(per.values()):.1f})")
    print(f"live-model write: numpy {live['numpy']:.1f} ns, compiled {live['compiled']:.1f} ns per change; a "
          f"tensor's whole apply {live['apply']:.1f} ns, {live['apply_with_live']:.1f} with the live words "
          "written in the kernel's pass")
    print(f"decode + BLAKE3, one thread: whole tensors {hashed['whole']:.3f} s, chunks of {args.chunk} behind the "
          f"decode {hashed['chunked']:.3f} s ({hashed['chunked'] / hashed['whole']:.2f}x)")
    print(json.dumps({"bench": "apply_profile", "changes": n, "ns_per_change": per, "live_ns_per_change": live,
                      "hash_s": hashed, "chunk": args.chunk}))


if __name__ == "__main__":
    main()
