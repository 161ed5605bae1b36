"""Weight sync over a real bandwidth-limited link: sparse patches vs dense BF16, same transport.

    sudo python bench/shaped_link.py [--rates 100mbit 1gbit] [--d-model 1024] [--layers 8] [--steps 4]
    sudo python bench/shaped_link.py --size 1b --emulate [--lr 3e-6]    # ~1.04 G params, emulated steps

``--size`` takes a preset of ``bench/workload.py`` (SIZES) in place of ``--d-model/--layers``;
``--emulate`` makes the versions with ``bench/emulated_steps.py`` (same weights, a calibrated
AdamW-like update without the optimizer, for sizes where AdamW does not fit in memory). The
trainer side also times what publishing a version costs (diff + encode, state hash, sign) and a
bare copy of the model beside it; the inference side splits apply + verify into decode + apply
and the result hash, with a bare copy of its state and the minor page faults of each phase.

A trainer side and an inference side run in two network namespaces joined by a veth pair
shaped with ``tc tbf``. The trainer side serves a version store (anchor 0 plus patches made by
real AdamW steps at lr 3e-6 on a model with pretrained-like weights, every version also kept as
a full anchor); the inference side holds version v-1 and, per version, times
fetch record + patch -> apply -> verify state hash ("publish-to-verified"), then times
fetching the dense BF16 anchor of the last version over the same py-libp2p data plane and
verifying it. Reports the time ratio, the byte ratio, and the overhead above
payload / link rate. Namespaces, veths and workers are removed at the end. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.netns_link import RATES, VethPair  # noqa: E402

LINK = VethPair("pulse-shA", "pulse-shB", "pshA0", "pshB0", "10.231.77.1", "10.231.77.2")


def _copy_seconds(state) -> float:
    """A bare copy of every tensor of ``state`` (the ratios' yardstick), timed."""
    t0 = time.perf_counter()
    copies = [t.bits.copy() for t in state.values()]
    dt = time.perf_counter() - t0
    del copies
    return dt


def _copy_warm_seconds(state) -> float:
    """A bare copy into buffers already touched (no page faults): the memory-bandwidth floor."""
    dst = [t.bits.copy() for t in state.values()]
    t0 = time.perf_counter()
    for d, t in zip(dst, state.values()):
        d[...] = t.bits
    dt = time.perf_counter() - t0
    del dst
    return dt


def _minflt() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def build_store(store: Path, *, d_model: int, layers: int, steps: int, size: str | None = None,
                emulate: bool = False, lr: float = 3e-6) -> dict:
    """Anchor 0 + `steps` versions (real AdamW or emulated steps); every version also as an anchor."""
    from bench.emulated_steps import states
    from bench.workload import ModelSize, adamw_bf16_states
    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import make_record
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.state import state_nbytes
    from pulse_node.codec.statehash import state_hash
    from pulse_node.codec.warmup import warm_up

    warm_up()  # a node does this at start
    ident = Identity.generate()
    if size is not None:
        gen = states(size=size, lr=lr, steps=steps, emulate=emulate)
    else:
        shape = ModelSize(vocab=32000, d_model=d_model, n_layers=layers, n_heads=max(1, d_model // 64), seq_len=64,
                          batch=2)
        gen = adamw_bf16_states(lr=lr, steps=steps, size=shape, warmup_steps=3)
    info = {"signer": ident.public_key_hex, "patch_bytes": [], "publish": [], "changed": []}
    from pulse_node.chain.verified import verify_version

    def verified(rec, patch=None, *, state=None):  # the gate's checks, as a node receiving it runs them
        return verify_version(rec, run_id=rec.run_id, trusted_signers=None, patch=patch, state=state)

    with VersionStore(store) as vs:
        prev_state = prev_rec = prev_hash = None
        for step, state in gen:
            t0 = time.perf_counter()
            new_hash = state_hash(state)
            t1 = time.perf_counter()
            patch = make_patch(prev_state, state, base_hash=prev_hash, new_hash=new_hash) if prev_state is not None else None
            t2 = time.perf_counter()
            rec = make_record(ident, run_id="shaped", version=step, parent=prev_rec, state_hash=new_hash,
                              patch=patch, anchor_version=step, is_anchor=True,
                              codec="pulsesync/compact/1" if patch else "anchor/safetensors")
            t3 = time.perf_counter()
            if patch is not None:
                vs.put_patch(verified(rec, patch))
                info["patch_bytes"].append(len(patch))
                info["publish"].append({"hash_s": t1 - t0, "diff_encode_s": t2 - t1, "sign_s": t3 - t2,
                                        "copy_s": _copy_seconds(state), "copy_warm_s": _copy_warm_seconds(state)})
                info["changed"].append(sum(int((state[k].bits != prev_state[k].bits).sum()) for k in state))
            t4 = time.perf_counter()
            vs.put_anchor(verified(rec, state=state))  # the dense comparison's file; not part of publishing a patch
            if patch is not None:
                info["publish"][-1]["anchor_write_s"] = time.perf_counter() - t4
            print(f"  built v{step}" + (f": patch {len(patch) / 1e6:.2f} MB, publish {info['publish'][-1]}"
                                        if patch else ""), flush=True)
            prev_state, prev_rec, prev_hash = state, rec, new_hash
        info["dense_bytes"] = state_nbytes(prev_state)
        info["params"] = sum(t.numel for t in prev_state.values())
        info["versions"] = steps
    return info


def client(peer: str, store: Path, work: Path, signer: str, versions: int) -> dict:
    """Inference side: per version fetch+apply+verify; then the dense anchor of the last version."""
    from pulse_node.chain.record import check_patch, decode_record, verify_record
    from pulse_node.codec.patch import apply_patch
    from pulse_node.codec.state import load_safetensors
    from pulse_node.codec.statehash import state_hash
    from pulse_node.codec.warmup import warm_up
    from pulse_node.net.wire import protocol as wp
    from pulse_node.net.wire.client import WireClient, WireConfig

    warm_up()  # a node does this at start
    state = load_safetensors(store / "anchors" / "0.safetensors")  # we hold version 0
    out = {"patch_seconds": [], "patch_bytes": []}
    with WireClient.start(WireConfig(store=work, listen=[f"/ip4/{LINK.ip_b}/tcp/0"])) as wire:
        wire.fetch(peer, wp.RecordRequest(version=0), work / "warm.rec", timeout=60)  # connection set-up
        base_hash = state_hash(state)
        for v in range(1, versions + 1):
            t0 = time.monotonic()
            wire.fetch(peer, wp.RecordRequest(version=v), work / f"{v}.rec", timeout=120)
            rec = decode_record((work / f"{v}.rec").read_bytes())
            verify_record(rec, run_id="shaped", trusted_signers=[signer])
            t1 = time.monotonic()
            wire.fetch(peer, wp.PatchRequest(version=v), work / f"{v}.patch", timeout=600)
            patch = (work / f"{v}.patch").read_bytes()
            check_patch(rec, patch)
            t2 = time.monotonic()
            # the receiver knows its base hash; apply checks the payload digest, decodes and applies,
            # then the result must hash to the signed state hash (what apply_patch(verify=True) does,
            # in two timed parts)
            f0 = _minflt()
            new = apply_patch(state, patch, verify=False, base_hash=base_hash)
            t3, f1 = time.monotonic(), _minflt()
            if state_hash(new) != rec.state_hash:
                raise RuntimeError(f"v{v}: result hash differs from the signed one")
            state, base_hash = new, rec.state_hash
            out["patch_seconds"].append(time.monotonic() - t0)
            out["patch_bytes"].append(len(patch))
            out.setdefault("phases", []).append({"record_s": t1 - t0, "patch_fetch_s": t2 - t1,
                                                 "decode_apply_s": t3 - t2, "result_hash_s": time.monotonic() - t3,
                                                 "apply_verify_s": time.monotonic() - t2,
                                                 "apply_minflt": f1 - f0, "copy_s": _copy_seconds(state),
                                                 "copy_warm_s": _copy_warm_seconds(state)})
        size = (store / "anchors" / f"{versions}.safetensors").stat().st_size
        t0 = time.monotonic()
        wire.fetch_anchor([peer], version=versions, size=size, dest=work / "dense.safetensors", timeout=3600)
        dense = load_safetensors(work / "dense.safetensors")
        assert state_hash(dense) == rec.state_hash
        out["dense_seconds"] = time.monotonic() - t0
        out["dense_bytes"] = size
    return out


def measure(rate: str, store: Path, info: dict) -> dict:
    out = LINK.run_pair(Path(__file__).resolve(), rate, store, [info["signer"], str(info["versions"])],
                        start_timeout=120, timeout=7200)
    bw = RATES[rate]
    p_bytes, p_secs = sum(out["patch_bytes"]) / len(out["patch_bytes"]), sum(out["patch_seconds"]) / len(out["patch_seconds"])
    return {"rate": rate, "patch_bytes": p_bytes, "patch_seconds": p_secs, "dense_bytes": out["dense_bytes"],
            "dense_seconds": out["dense_seconds"], "time_ratio": out["dense_seconds"] / p_secs,
            "byte_ratio": out["dense_bytes"] / p_bytes,
            "patch_overhead_s": p_secs - p_bytes / bw, "dense_overhead_s": out["dense_seconds"] - out["dense_bytes"] / bw,
            "patch_ideal_s": p_bytes / bw, "dense_ideal_s": out["dense_bytes"] / bw,
            "patch_phases": out["phases"],
            "patch_phases_mean_s": {k: sum(ph[k] for ph in out["phases"]) / len(out["phases"])
                                    for k in out["phases"][0]},
            "apply_verify_x_copy": sum(ph["apply_verify_s"] / ph["copy_s"] for ph in out["phases"]) / len(out["phases"]),
            "apply_verify_x_warm_copy": sum(ph["apply_verify_s"] / ph["copy_warm_s"]
                                            for ph in out["phases"]) / len(out["phases"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"], choices=sorted(RATES))
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--size", choices=["34m", "166m", "1b"], help="a bench/workload.py preset (overrides --d-model/--layers)")
    ap.add_argument("--emulate", action="store_true", help="emulated steps (bench/emulated_steps.py) instead of AdamW")
    ap.add_argument("--lr", type=float, default=3e-6)
    ap.add_argument("--serve", nargs=3, metavar=("STORE", "READY", "STOP"))
    ap.add_argument("--client", nargs=5, metavar=("PEER", "STORE", "WORK", "SIGNER", "VERSIONS"))
    args = ap.parse_args()
    if args.serve:
        LINK.serve(Path(args.serve[0]), Path(args.serve[1]), Path(args.serve[2]))
        return
    if args.client:
        peer, store, work, signer, versions = args.client
        Path(work).mkdir(parents=True, exist_ok=True)
        print(json.dumps(client(peer, Path(store), Path(work), signer, int(versions))))
        return
    if os.geteuid() != 0:
        sys.exit("shaped_link needs root (ip netns, tc)")
    with tempfile.TemporaryDirectory(prefix="pulse-shaped-store-") as tmp:
        info = build_store(Path(tmp) / "store", d_model=args.d_model, layers=args.layers, steps=args.steps,
                           size=args.size, emulate=args.emulate, lr=args.lr)
        pub = {k: sum(p[k] for p in info["publish"]) / len(info["publish"]) for k in info["publish"][0]}
        pub["publish_s"] = pub["hash_s"] + pub["diff_encode_s"] + pub["sign_s"]
        pub["publish_x_copy"] = pub["publish_s"] / pub["copy_s"]
        pub["publish_x_warm_copy"] = pub["publish_s"] / pub["copy_warm_s"]
        info["publish_mean"] = pub
        changed = sum(info["changed"]) / len(info["changed"])
        print(f"model: {info['params'] / 1e6:.0f} M params, dense BF16 {info['dense_bytes'] / 1e6:.0f} MB, "
              f"mean patch {sum(info['patch_bytes']) / len(info['patch_bytes']) / 1e6:.2f} MB, "
              f"changed {changed / info['params']:.3%}, {sum(info['patch_bytes']) / sum(info['changed']):.3f} B/change; "
              f"publish (hash + diff/encode + sign) {pub['publish_s']:.2f} s = {pub['publish_x_copy']:.1f}x a copy "
              f"({pub['copy_s']:.2f} s): {pub}")
        results = []
        try:
            for rate in args.rates:
                r = measure(rate, Path(tmp) / "store", info)
                results.append(r)
                print(f"{rate}: patch {r['patch_bytes'] / 1e6:.2f} MB in {r['patch_seconds']:.2f} s "
                      f"(ideal {r['patch_ideal_s']:.2f} s, overhead {r['patch_overhead_s']:.2f} s); "
                      f"dense {r['dense_bytes'] / 1e6:.0f} MB in {r['dense_seconds']:.1f} s "
                      f"(ideal {r['dense_ideal_s']:.1f} s); time ratio {r['time_ratio']:.1f}x, "
                      f"byte ratio {r['byte_ratio']:.1f}x; apply+verify {r['apply_verify_x_copy']:.1f}x a copy; "
                      f"patch phases {r['patch_phases_mean_s']}", flush=True)
        finally:
            LINK.down()
    print(json.dumps({"params": info["params"], "size": args.size, "emulate": args.emulate, "lr": args.lr,
                      "changed_fraction": sum(info["changed"]) / len(info["changed"]) / info["params"],
                      "bytes_per_change": sum(info["patch_bytes"]) / sum(info["changed"]),
                      "publish": info["publish_mean"], "results": results}))


if __name__ == "__main__":
    main()
