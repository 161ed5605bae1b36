"""Data-plane throughput on loopback: py-libp2p streams, our fetch path, hivemind's p2pd streams.

Run: ``/work/venv/bin/python bench/dataplane.py [--size-mb 100] [--stream-mb 64] [--rounds 2]``
 or: ``/work/venv/bin/python bench/dataplane.py --push [--params-m 100 900] [--rounds 3] [--shaped 1gbit]``

Measured side by side in one run (the machine is shared and noisy; each figure is the best of
``--rounds``):

1. one py-libp2p stream (TCP + Noise + yamux, the wire worker's host) between two processes,
   with 64 KiB, 256 KiB and 1 MiB writes;
2. our fetch path end to end (file -> peer -> file, sha256-checked, fsynced, renamed) between
   two ``wire_worker`` processes: single-stream ``fetch`` and chunked ``fetch_anchor`` from one
   and from two providers;
3. hivemind 1.1.12's binary stream (python -> p2pd -> TCP -> p2pd -> python) with the same
   write sizes, in separate subprocesses (hivemind and libp2p cannot share a process).

``--push`` instead times what a trainer does each round: a real encoded PULSELoCo payload
(``--params-m`` million FP32 weights, ``--density`` of them fired) pushed node to node, from
``push()`` in the sending node to the payload in the receiving node's hands (its ``events()``),
on both planes side by side (the wire worker's ``push`` and the DHT worker's p2pd push plane,
``net/dht/push.py``), alternating planes each round. The receiving node runs in its own
process; with ``--shaped RATE`` (root) both run in the network namespaces of
``bench/shaped_link.py`` joined by a ``tc tbf``-shaped veth, removed at the end.

Prints ratios; the last line is JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
WRITES = (64 * 1024, 256 * 1024, 1 << 20)
SINK = "/pulse-bench/sink/1.0.0"


# ------------------------------------------------------------------ py-libp2p (trio) sides

def _libp2p_host():
    import multiaddr
    from libp2p.crypto.ed25519 import create_new_key_pair

    from pulse_node.net.wire.worker import make_host

    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    return make_host(create_new_key_pair(), listen, []), listen


async def _libp2p_sink_main() -> None:
    import trio
    from libp2p.custom_types import TProtocol

    host, listen = _libp2p_host()

    async def handle(stream) -> None:
        head = b""
        while len(head) < 8:
            head += await stream.read(8 - len(head))
        total, got = int.from_bytes(head, "big"), 0
        while got < total:
            got += len(await stream.read(1 << 20))
        await stream.write(got.to_bytes(8, "big"))
        await stream.close()

    host.set_stream_handler(TProtocol(SINK), handle)
    async with host.run(listen):
        print(str(host.get_addrs()[0]), flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin


async def _libp2p_send(maddr: str, sizes: tuple[int, ...], total: int) -> dict[int, float]:
    import multiaddr
    from libp2p.custom_types import TProtocol
    from libp2p.peer.peerinfo import info_from_p2p_addr

    host, listen = _libp2p_host()
    out: dict[int, float] = {}
    async with host.run(listen):
        info = info_from_p2p_addr(multiaddr.Multiaddr(maddr))
        await host.connect(info)
        for w in sizes:
            stream = await host.new_stream(info.peer_id, [TProtocol(SINK)])
            buf, n = os.urandom(w), total // w
            t0 = time.perf_counter()
            await stream.write((n * w).to_bytes(8, "big"))
            for _ in range(n):
                await stream.write(buf)
            ack = await stream.read(8)
            out[w] = n * w / (time.perf_counter() - t0) / 1e6
            assert int.from_bytes(ack, "big") == n * w
            await stream.close()
    return out


def bench_libp2p_stream(total: int) -> dict[int, float]:
    import trio

    sink = subprocess.Popen([sys.executable, __file__, "--child", "libp2p-sink"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        maddr = sink.stdout.readline().strip()
        return trio.run(_libp2p_send, maddr, WRITES, total)
    finally:
        sink.stdin.close()
        sink.wait(timeout=20)


# ------------------------------------------------------------------ hivemind (asyncio) sides

async def _hivemind_sink_main() -> None:
    import asyncio

    from hivemind.p2p import P2P

    p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])

    async def handle(_info, reader, writer) -> None:
        total, got = int.from_bytes(await reader.readexactly(8), "big"), 0
        while got < total:
            got += len(await reader.read(1 << 20))
        writer.write(got.to_bytes(8, "big"))
        await writer.drain()
        writer.close()

    await p2p.add_binary_stream_handler(SINK, handle)
    print(json.dumps([str(m) for m in await p2p.get_visible_maddrs()]), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await p2p.shutdown()


async def _hivemind_send_main(maddrs: list[str], total: int) -> None:
    from hivemind.p2p import P2P, PeerID
    from multiaddr import Multiaddr

    p2p = await P2P.create(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    peer = PeerID.from_base58(Multiaddr(maddrs[0])["p2p"])
    out = {}
    for w in WRITES:
        _, reader, writer = await p2p.call_binary_stream_handler(peer, SINK)
        buf, n = os.urandom(w), total // w
        t0 = time.perf_counter()
        writer.write((n * w).to_bytes(8, "big"))
        for _ in range(n):
            writer.write(buf)
            await writer.drain()
        ack = await reader.readexactly(8)
        out[w] = n * w / (time.perf_counter() - t0) / 1e6
        assert int.from_bytes(ack, "big") == n * w
        writer.close()
    print(json.dumps(out), flush=True)
    await p2p.shutdown()


def bench_hivemind_stream(total: int) -> dict[int, float]:
    sink = subprocess.Popen([sys.executable, __file__, "--child", "hivemind-sink"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        maddrs = json.loads(sink.stdout.readline())
        out = subprocess.run([sys.executable, __file__, "--child", "hivemind-send", "--total", str(total),
                              "--maddrs", json.dumps(maddrs)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"hivemind sender failed: {out.stderr[-2000:]}")
        return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    finally:
        sink.stdin.close()
        sink.wait(timeout=30)


# ------------------------------------------------------------------ our fetch path

def bench_fetch(size: int, rounds: int, tmp: Path) -> dict[str, float]:
    from concurrent.futures import ThreadPoolExecutor

    from pulse_node.net.wire import protocol as wp
    from pulse_node.net.wire.client import WireClient, WireConfig

    data = os.urandom(size)
    digest = hashlib.sha256(data).hexdigest()
    for name in ("a", "c"):
        (tmp / name / "anchors").mkdir(parents=True)
        (tmp / name / "patches").mkdir(parents=True)
        (tmp / name / "anchors" / "1.safetensors").write_bytes(data)
        os.link(tmp / name / "anchors" / "1.safetensors", tmp / name / "patches" / "1.patch")
    (tmp / "b").mkdir()
    with ThreadPoolExecutor(3) as pool:
        a, b, c = pool.map(lambda n: WireClient.start(WireConfig(store=tmp / n)), ("a", "b", "c"))
    best = {"fetch": 0.0, "anchor_1": 0.0, "anchor_2": 0.0}
    try:
        pa, pc = a.info().listen_maddrs[0], c.info().listen_maddrs[0]
        for _ in range(rounds):
            r = b.fetch(pa, wp.PatchRequest(version=1), tmp / "b" / "f.bin", timeout=300, expected_digest=digest)
            best["fetch"] = max(best["fetch"], size / r.seconds / 1e6)
            for key, peers in (("anchor_1", [pa]), ("anchor_2", [pa, pc])):
                dest = tmp / "b" / f"{key}.bin"
                r = b.fetch_anchor(peers, version=1, size=size, dest=dest, digest=digest, timeout=300)
                best[key] = max(best[key], size / r.seconds / 1e6)
                dest.unlink()
            (tmp / "b" / "f.bin").unlink()
    finally:
        for w in (a, b, c):
            w.stop()
    return best


# ------------------------------------------------------------------ node-to-node payload push, both planes

def make_payload(params_m: float, density: float, seed: int = 0) -> bytes:
    """A real encoded PULSELoCo payload: ``density`` of ``params_m`` M weights fire (16M-element tensors)."""
    import numpy as np

    from pulse_node.loco.payload import LocoPayload, encode_payload

    rng, tensor, total = np.random.default_rng(seed), 16 << 20, int(params_m * 1e6)
    tensors, numel = {}, {}
    for i, start in enumerate(range(0, total, tensor)):
        n = min(tensor, total - start)
        k = max(1, int(n * density))
        pos = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
        tensors[f"layers.{i}.weight"] = (pos, (rng.standard_normal(k) * 1e-4).astype(np.float32))
        numel[f"layers.{i}.weight"] = n
    return encode_payload(LocoPayload(round=1, trainer_id="bench", base_hash=b"\0" * 32, tensors=tensors,
                                      numel=numel))


def _push_workers(host: str, work: Path):
    """One node's two workers, listening on ``host``; both accept pushes."""
    from concurrent.futures import ThreadPoolExecutor

    from pulse_node.net.dht.client import DhtClient, DhtConfig
    from pulse_node.net.wire.client import WireClient, WireConfig

    (work / "store").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        wire = pool.submit(WireClient.start, WireConfig(store=work / "store", listen=[f"/ip4/{host}/tcp/0"]))
        dht = pool.submit(DhtClient.start, DhtConfig(run_id="bench-push", host_maddrs=[f"/ip4/{host}/tcp/0"],
                                                     accept_pushes=True))
        return wire.result(), dht.result()


def _push_receiver_main(host: str, work: Path, payload: Path) -> None:
    """The receiving node: drain both planes, append one JSON line per payload to recv.jsonl."""
    wire, dht = _push_workers(host, work)
    try:
        w, d = wire.info(), dht.info()
        print(json.dumps({"wire": f"{w.listen_maddrs[0]}/p2p/{w.peer_id}", "dht_id": d.peer_id,
                          "dht_maddrs": d.visible_maddrs}), flush=True)
        want = hashlib.sha256(payload.read_bytes()).hexdigest()
        with open(work / "recv.jsonl", "a") as out:
            while not (work / "stop").exists():
                got = [("wire", e) for e in wire.events(max_events=8, wait_s=0.02)]
                got += [("hivemind", e) for e in dht.events(max_events=8)]
                for plane, e in got:
                    at = time.time()
                    out.write(json.dumps({"plane": plane, "bytes": len(e.data), "at": at, "queued_at": e.received_at,
                                          "exact": hashlib.sha256(e.data).hexdigest() == want}) + "\n")
                    out.flush()
    finally:
        wire.stop()
        dht.stop()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _push_once(push, work: Path, data: bytes) -> dict:
    """One push; wall time from the call to the receiving node holding the payload."""
    seen = len(_lines(work / "recv.jsonl"))
    t0, m0 = time.time(), time.monotonic()
    push(data)
    ack = time.monotonic() - m0
    deadline = time.monotonic() + 600
    while len(lines := _lines(work / "recv.jsonl")) <= seen:
        if time.monotonic() > deadline:
            raise RuntimeError("the receiver did not report the payload within 600 s")
        time.sleep(0.005)
    rec = lines[seen]
    return {"plane": rec["plane"], "seconds": rec["at"] - t0, "ack_s": ack, "exact": rec["exact"]}


def _push_sender_main(host: str, work: Path, payload: Path, peer: dict, rounds: int) -> None:
    wire, dht = _push_workers(host, work / "sender")
    data = payload.read_bytes()
    planes = {"wire": lambda b: wire.push(peer["wire"], "loco", b, timeout=300),
              "hivemind": lambda b: dht.push(peer["dht_id"], peer["dht_maddrs"], "loco", b, timeout=300)}
    try:
        for push in planes.values():  # connection set-up is not what we time
            _push_once(push, work, b"warm-up")
        out = [_push_once(planes[name], work, data) for _ in range(rounds) for name in ("wire", "hivemind")]
        out.append({"stats": {"wire": wire.stats().errors, "hivemind": dht.push_stats().errors}})
        print(json.dumps(out), flush=True)
    finally:
        wire.stop()
        dht.stop()


def run_push_pair(payload: Path, work: Path, rounds: int, shaped: str | None) -> list[dict]:
    """Receiver and sender node processes (in the shaped namespaces if ``shaped``); their timings."""
    py = [sys.executable, str(Path(__file__).resolve())]
    if shaped:
        from bench.shaped_link import IP_A, IP_B, NS_A, NS_B

        recv_cmd, send_cmd, ips = ["ip", "netns", "exec", NS_A, *py], ["ip", "netns", "exec", NS_B, *py], (IP_A, IP_B)
    else:
        recv_cmd, send_cmd, ips = py, py, ("127.0.0.1", "127.0.0.1")
    work.mkdir(parents=True)
    recv = subprocess.Popen([*recv_cmd, "--child", "push-recv", "--host", ips[0], "--work", str(work),
                             "--payload", str(payload)], stdout=subprocess.PIPE, text=True)
    try:
        peer = recv.stdout.readline()
        if not peer:
            raise RuntimeError("the receiving node did not start")
        res = subprocess.run([*send_cmd, "--child", "push-send", "--host", ips[1], "--work", str(work),
                              "--payload", str(payload), "--peer", peer.strip(), "--rounds", str(rounds)],
                             capture_output=True, text=True, timeout=3600)
        if res.returncode != 0:
            raise RuntimeError(f"sender failed: {res.stderr[-2000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        (work / "stop").touch()
        try:
            recv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            recv.kill()
            recv.wait(timeout=10)


def _summarize_push(runs: list[dict], size: int) -> dict:
    out: dict = {"errors": runs[-1]["stats"]}
    for plane in ("wire", "hivemind"):
        secs = sorted(r["seconds"] for r in runs[:-1] if r["plane"] == plane)
        assert all(r["exact"] for r in runs[:-1]), "a payload arrived altered"
        out[plane] = {"best_s": round(secs[0], 3), "median_s": round(secs[len(secs) // 2], 3),
                      "best_mbps": round(size / secs[0] / 1e6, 1),
                      "ack_best_s": round(min(r["ack_s"] for r in runs[:-1] if r["plane"] == plane), 3)}
    out["wire_over_hivemind"] = round(out["wire"]["median_s"] / out["hivemind"]["median_s"], 2)
    return out


def bench_push(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    if args.shaped and os.geteuid() != 0:
        sys.exit("--shaped needs root (ip netns, tc)")
    from bench.shaped_link import netns_down, netns_up

    results = []
    with tempfile.TemporaryDirectory(prefix="pulse-push-bench-") as d:
        for params_m in args.params_m:
            payload = Path(d) / f"payload-{params_m}.bin"
            payload.write_bytes(make_payload(params_m, args.density))
            size = payload.stat().st_size
            for link in ["loopback", *args.shaped]:
                shaped = None if link == "loopback" else link
                try:
                    if shaped:
                        netns_up(shaped)
                    runs = run_push_pair(payload, Path(d) / f"{params_m}-{link}", args.rounds, shaped)
                finally:
                    if shaped:
                        netns_down()
                r = {"params_m": params_m, "payload_mb": round(size / 1e6, 2), "link": link,
                     **_summarize_push(runs, size)}
                results.append(r)
                print(f"{params_m:g}M params @ {args.density:g} -> {size / 1e6:.1f} MB payload, {link}: "
                      f"wire {r['wire']['median_s']:.2f} s (best {r['wire']['best_mbps']} MB/s), "
                      f"hivemind {r['hivemind']['median_s']:.2f} s (best {r['hivemind']['best_mbps']} MB/s), "
                      f"wire/hivemind {r['wire_over_hivemind']}x; errors {r['errors']}", flush=True)
    print(json.dumps({"bench": "dataplane-push", "density": args.density, "rounds": args.rounds, "results": results}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=100, help="file size for the fetch path")
    p.add_argument("--stream-mb", type=int, default=64, help="bytes per raw stream measurement")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--push", action="store_true", help="time PULSELoCo payload pushes node to node, both planes")
    p.add_argument("--params-m", type=float, nargs="+", default=[100, 900], help="model size(s), M weights")
    p.add_argument("--density", type=float, default=0.01, help="fraction of weights that fire per round")
    p.add_argument("--shaped", nargs="*", default=[], choices=["100mbit", "1gbit"], help="also over a shaped link")
    p.add_argument("--child", choices=["libp2p-sink", "hivemind-sink", "hivemind-send", "push-recv", "push-send"])
    p.add_argument("--total", type=int)
    p.add_argument("--maddrs")
    p.add_argument("--host")
    p.add_argument("--work", type=Path)
    p.add_argument("--payload", type=Path)
    p.add_argument("--peer")
    args = p.parse_args()
    if args.child:
        return _child(args)
    if args.push:
        return bench_push(args)
    total = args.stream_mb * MiB
    lp = dict.fromkeys(WRITES, 0.0)
    hm = dict.fromkeys(WRITES, 0.0)
    for r in range(args.rounds):
        for w, v in bench_libp2p_stream(total).items():
            lp[w] = max(lp[w], v)
        for w, v in bench_hivemind_stream(total).items():
            hm[w] = max(hm[w], v)
        print(f"round {r + 1}: libp2p {_fmt(lp)} | hivemind {_fmt(hm)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pulse-dataplane-") as d:
        fetch = bench_fetch(args.size_mb * MiB, args.rounds, Path(d))
    _report(lp, hm, fetch, args)
    return 0


def _child(args: argparse.Namespace) -> int:
    import asyncio

    if args.child == "push-recv":
        _push_receiver_main(args.host, args.work, args.payload)
    elif args.child == "push-send":
        _push_sender_main(args.host, args.work, args.payload, json.loads(args.peer), args.rounds)
    elif args.child == "libp2p-sink":
        import trio

        trio.run(_libp2p_sink_main)
    elif args.child == "hivemind-sink":
        asyncio.run(_hivemind_sink_main())
    else:
        asyncio.run(_hivemind_send_main(json.loads(args.maddrs), args.total))
    return 0


def _fmt(d: dict[int, float]) -> str:
    return " ".join(f"{w // 1024}K={v:.1f}" for w, v in d.items())


def _report(lp: dict[int, float], hm: dict[int, float], fetch: dict[str, float], args: argparse.Namespace) -> None:
    best_lp, best_hm = max(lp.values()), max(hm.values())
    print(f"\npy-libp2p one stream MB/s: {_fmt(lp)}")
    print(f"hivemind p2pd stream MB/s: {_fmt(hm)}")
    print(f"fetch path ({args.size_mb} MB file->peer->file) MB/s: single stream {fetch['fetch']:.1f}, "
          f"anchor 1 provider {fetch['anchor_1']:.1f}, 2 providers {fetch['anchor_2']:.1f}")
    ratios = {
        "libp2p_256k_vs_64k": lp[WRITES[1]] / lp[WRITES[0]],
        "libp2p_1m_vs_64k": lp[WRITES[2]] / lp[WRITES[0]],
        "fetch_vs_raw_libp2p_64k": fetch["fetch"] / lp[WRITES[0]],
        "anchor2_vs_anchor1": fetch["anchor_2"] / fetch["anchor_1"],
        "hivemind_best_vs_libp2p_best": best_hm / best_lp,
        "hivemind_best_vs_fetch": best_hm / fetch["fetch"],
    }
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}x")
    print(json.dumps({"bench": "dataplane", "size_mb": args.size_mb, "stream_mb": args.stream_mb,
                      "rounds": args.rounds, "libp2p_stream_mbps": {str(k): round(v, 1) for k, v in lp.items()},
                      "hivemind_stream_mbps": {str(k): round(v, 1) for k, v in hm.items()},
                      "fetch_mbps": {k: round(v, 1) for k, v in fetch.items()},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    raise SystemExit(main())
