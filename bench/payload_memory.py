"""Peak memory of coding one PULSELoCo payload against the round's base, per model parameter.

Every trainer codes its payload against the FP32 global weights (``loco.base_coding``) and
decodes the others'; the coders label every weight for the position context, so their
transient memory scales with the model, not with the payload. Measured with tracemalloc
(numpy's allocations included). Prints bytes per parameter; last line JSON.

    python bench/payload_memory.py [--params 20000000] [--fired 0.02]
"""

from __future__ import annotations

import argparse
import json
import tracemalloc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=20_000_000)
    ap.add_argument("--fired", type=float, default=0.02, help="fraction of entries in the payload")
    args = ap.parse_args()
    import numpy as np

    from pulse_node.loco.payload import LocoPayload, decode_payload, encode_payload

    n, rng = args.params, np.random.default_rng(0)
    base = {"w": rng.standard_normal(n).astype(np.float32) * 0.02}
    pos = np.sort(rng.choice(n, int(n * args.fired), replace=False)).astype(np.int64)
    vals = (base["w"][pos] * 2.0 ** -7 * rng.choice([-1, 1], pos.size)).astype(np.float32)
    payload = LocoPayload(round=1, trainer_id="t", base_hash=bytes(32), tensors={"w": (pos, vals)}, numel={"w": n})
    tracemalloc.start()
    data = encode_payload(payload, base=base)
    encode_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    decode_payload(data, shapes={"w": (n,)}, max_bytes=1 << 31, base=base)
    decode_peak = tracemalloc.get_traced_memory()[1]
    out = {"params": n, "fired": args.fired, "payload_bytes": len(data),
           "encode_bytes_per_param": round(encode_peak / n, 1), "decode_bytes_per_param": round(decode_peak / n, 1)}
    print(f"{n:,} params, {pos.size:,} fired: payload {len(data):,} B; transient peak: encode "
          f"{out['encode_bytes_per_param']} B/param, decode {out['decode_bytes_per_param']} B/param")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
