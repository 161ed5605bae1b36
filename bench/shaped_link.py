"""Weight sync over a real bandwidth-limited link: sparse patches vs dense BF16, same transport.

    sudo python bench/shaped_link.py [--rates 100mbit 1gbit] [--d-model 1024] [--layers 8] [--steps 4]

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NS_A, NS_B = "pulse-shA", "pulse-shB"
IP_A, IP_B = "10.231.77.1", "10.231.77.2"
RATES = {"100mbit": 100e6 / 8, "1gbit": 1e9 / 8}


def sh(*cmd: str, check: bool = True) -> None:
    subprocess.run(cmd, check=check, capture_output=True)


def netns_up(rate: str) -> None:
    netns_down()
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    sh("ip", "link", "add", "pshA0", "type", "veth", "peer", "name", "pshB0")
    for ns, dev, ip in ((NS_A, "pshA0", IP_A), (NS_B, "pshB0", IP_B)):
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/30", "dev", dev)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
           "burst", "1mb" if rate == "1gbit" else "256kb", "latency", "50ms")


def netns_down() -> None:
    for ns in (NS_A, NS_B):
        sh("ip", "netns", "del", ns, check=False)


def build_store(store: Path, *, d_model: int, layers: int, steps: int) -> dict:
    """Anchor 0 + `steps` versions from real AdamW steps; every version also as an anchor."""
    from bench.workload import ModelSize, adamw_bf16_states
    from pulse_node.chain.identity import Identity
    from pulse_node.chain.record import make_record
    from pulse_node.chain.store import VersionStore
    from pulse_node.codec.patch import make_patch
    from pulse_node.codec.state import state_nbytes
    from pulse_node.codec.statehash import state_hash

    ident = Identity.generate()
    size = ModelSize(vocab=32000, d_model=d_model, n_layers=layers, n_heads=max(1, d_model // 64), seq_len=64, batch=2)
    info = {"signer": ident.public_key_hex, "patch_bytes": []}
    with VersionStore(store) as vs:
        prev_state = prev_rec = None
        for step, state in adamw_bf16_states(lr=3e-6, steps=steps, size=size, warmup_steps=3):
            patch = make_patch(prev_state, state) if prev_state is not None else None
            rec = make_record(ident, run_id="shaped", version=step, parent=prev_rec, state_hash=state_hash(state),
                              patch=patch, anchor_version=step, is_anchor=True,
                              codec="pulsesync/compact/1" if patch else "anchor/safetensors")
            if patch is not None:
                vs.put_patch(rec, patch)
                info["patch_bytes"].append(len(patch))
            vs.put_anchor(rec, state)
            prev_state, prev_rec = state, rec
        info["dense_bytes"] = state_nbytes(prev_state)
        info["params"] = sum(t.numel for t in prev_state.values())
        info["versions"] = steps
    return info


def serve(store: Path, ready: Path, stop: Path) -> None:
    from pulse_node.net.wire_client import WireClient, WireConfig

    with WireClient.start(WireConfig(store=store, listen=[f"/ip4/{IP_A}/tcp/0"])) as wire:
        me = wire.info()
        ready.write_text(next(m for m in me.listen_maddrs if IP_A in m) + f"/p2p/{me.peer_id}")
        while not stop.exists():
            time.sleep(0.1)


def client(peer: str, store: Path, work: Path, signer: str, versions: int) -> dict:
    """Inference side: per version fetch+apply+verify; then the dense anchor of the last version."""
    from pulse_node.chain.record import check_patch, decode_record, verify_record
    from pulse_node.codec.patch import apply_patch
    from pulse_node.codec.state import load_safetensors
    from pulse_node.codec.statehash import state_hash
    from pulse_node.net.wire_client import WireClient, WireConfig

    from pulse_node.codec.warmup import warm_up

    warm_up()  # a node does this at start
    state = load_safetensors(store / "anchors" / "0.safetensors")  # we hold version 0
    out = {"patch_seconds": [], "patch_bytes": []}
    with WireClient.start(WireConfig(store=work, listen=[f"/ip4/{IP_B}/tcp/0"])) as wire:
        wire.fetch(peer, "record", {"version": 0}, work / "warm.rec", timeout=60)  # connection set-up
        base_hash = state_hash(state)
        for v in range(1, versions + 1):
            t0 = time.monotonic()
            wire.fetch(peer, "record", {"version": v}, work / f"{v}.rec", timeout=120)
            rec = decode_record((work / f"{v}.rec").read_bytes())
            verify_record(rec, run_id="shaped", trusted_signers=[signer])
            t1 = time.monotonic()
            wire.fetch(peer, "patch", {"version": v}, work / f"{v}.patch", timeout=600)
            patch = (work / f"{v}.patch").read_bytes()
            check_patch(rec, patch)
            t2 = time.monotonic()
            # the receiver knows its base hash; apply checks the result against the signed hash
            state = apply_patch(state, patch, verify=True, base_hash=base_hash)
            base_hash = rec.state_hash
            out["patch_seconds"].append(time.monotonic() - t0)
            out["patch_bytes"].append(len(patch))
            out.setdefault("phases", []).append({"record_s": t1 - t0, "patch_fetch_s": t2 - t1,
                                                 "apply_verify_s": time.monotonic() - t2})
        size = (store / "anchors" / f"{versions}.safetensors").stat().st_size
        t0 = time.monotonic()
        wire.fetch_anchor([peer], version=versions, size=size, dest=work / "dense.safetensors", timeout=3600)
        dense = load_safetensors(work / "dense.safetensors")
        assert state_hash(dense) == rec.state_hash
        out["dense_seconds"] = time.monotonic() - t0
        out["dense_bytes"] = size
    return out


def measure(rate: str, store: Path, info: dict) -> dict:
    netns_up(rate)
    tmp = Path(tempfile.mkdtemp(prefix="pulse-shaped-"))
    ready, stop = tmp / "ready", tmp / "stop"
    py = [sys.executable, str(Path(__file__).resolve())]
    server = subprocess.Popen(["ip", "netns", "exec", NS_A, *py, "--serve", str(store), str(ready), str(stop)])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        res = subprocess.run(["ip", "netns", "exec", NS_B, *py, "--client", ready.read_text(), str(store),
                              str(tmp / "work"), info["signer"], str(info["versions"])],
                             capture_output=True, text=True, timeout=7200)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        out = json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        stop.write_text("1")
        server.wait(timeout=30)
        netns_down()
    bw = RATES[rate]
    p_bytes, p_secs = sum(out["patch_bytes"]) / len(out["patch_bytes"]), sum(out["patch_seconds"]) / len(out["patch_seconds"])
    return {"rate": rate, "patch_bytes": p_bytes, "patch_seconds": p_secs, "dense_bytes": out["dense_bytes"],
            "dense_seconds": out["dense_seconds"], "time_ratio": out["dense_seconds"] / p_secs,
            "byte_ratio": out["dense_bytes"] / p_bytes,
            "patch_overhead_s": p_secs - p_bytes / bw, "dense_overhead_s": out["dense_seconds"] - out["dense_bytes"] / bw,
            "patch_ideal_s": p_bytes / bw, "dense_ideal_s": out["dense_bytes"] / bw,
            "patch_phases_mean_s": {k: sum(ph[k] for ph in out["phases"]) / len(out["phases"])
                                    for k in out["phases"][0]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"], choices=sorted(RATES))
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--serve", nargs=3, metavar=("STORE", "READY", "STOP"))
    ap.add_argument("--client", nargs=5, metavar=("PEER", "STORE", "WORK", "SIGNER", "VERSIONS"))
    args = ap.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]), Path(args.serve[2]))
        return
    if args.client:
        peer, store, work, signer, versions = args.client
        Path(work).mkdir(parents=True, exist_ok=True)
        print(json.dumps(client(peer, Path(store), Path(work), signer, int(versions))))
        return
    if os.geteuid() != 0:
        sys.exit("shaped_link needs root (ip netns, tc)")
    with tempfile.TemporaryDirectory(prefix="pulse-shaped-store-") as tmp:
        info = build_store(Path(tmp) / "store", d_model=args.d_model, layers=args.layers, steps=args.steps)
        print(f"model: {info['params'] / 1e6:.0f} M params, dense BF16 {info['dense_bytes'] / 1e6:.0f} MB, "
              f"mean patch {sum(info['patch_bytes']) / len(info['patch_bytes']) / 1e6:.2f} MB")
        results = []
        try:
            for rate in args.rates:
                r = measure(rate, Path(tmp) / "store", info)
                results.append(r)
                print(f"{rate}: patch {r['patch_bytes'] / 1e6:.2f} MB in {r['patch_seconds']:.2f} s "
                      f"(ideal {r['patch_ideal_s']:.2f} s, overhead {r['patch_overhead_s']:.2f} s); "
                      f"dense {r['dense_bytes'] / 1e6:.0f} MB in {r['dense_seconds']:.1f} s "
                      f"(ideal {r['dense_ideal_s']:.1f} s); time ratio {r['time_ratio']:.1f}x, "
                      f"byte ratio {r['byte_ratio']:.1f}x; patch phases {r['patch_phases_mean_s']}")
        finally:
            netns_down()
    print(json.dumps({"params": info["params"], "results": results}))


if __name__ == "__main__":
    main()
