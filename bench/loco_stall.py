"""Round time of a PULSELoCo swarm with one vanished trainer, against the same swarm without it.

    python bench/loco_stall.py [--trainers 3] [--versions 6] [--deadline 3] [--decision-wait 2]

Real trainer roles as threads over the in-memory transport (``InProcessSwarm``), tiny model. The
vanished trainer is still listed by discovery (as a dead peer is until its DHT record expires,
or a peer behind a NAT mapping that just died), but every push to it and fetch from it hangs
until its timeout and then fails. Its payload never comes, so each round waits for the
deadline; what this measures is what the round costs beyond that: pushes that wait on the dead
peer before the others get theirs or before the round goes on. Prints seconds per version
(median over the versions after the first two) with and without the vanished peer, measured
one after the other in one run, the time a round waits beyond the deadline, and the ratio of
the round time to (deadline + an all-live round): 1.0 would be no stall at all. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from pulse_node.chain.peer import PeerRecord, PeerStatus
from pulse_node.config import TrainerConfig
from pulse_node.daemon.transport import Event, Transport
from pulse_node.errors import WireError
from pulse_node.net.wire.protocol import FetchRequest, kind_of
from pulse_node.testing.inprocess import InProcessSwarm, node_status, node_version

VANISHED = "trainer-zz"
SMALL = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2}, "task": {"digits": 2},
         "sampling": {"prompts_per_batch": 4, "group_size": 4, "max_new_tokens": 6}}


class Hanging:
    """A transport whose pushes to and fetches from ``VANISHED`` hang for their timeout, then fail."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.peer_id = inner.peer_id

    def publish(self, status: PeerStatus) -> None:
        self.inner.publish(status)

    def peers(self) -> list[PeerRecord]:
        return self.inner.peers()

    def fetch(self, peer: PeerRecord, request: FetchRequest, dest: Path, *, timeout: float,
              max_bytes: int | None = None) -> int:
        if peer.peer_id == VANISHED:
            time.sleep(timeout)
            raise WireError(f"{kind_of(request)} fetch from {VANISHED}: no answer within {timeout:.1f}s")
        return self.inner.fetch(peer, request, dest, timeout=timeout, max_bytes=max_bytes)

    def fetch_anchor(self, providers: list[PeerRecord], **kw: Any) -> Any:
        return self.inner.fetch_anchor([p for p in providers if p.peer_id != VANISHED], **kw)

    def push(self, peer: PeerRecord, kind: str, data: bytes, *, timeout: float) -> None:
        if peer.peer_id == VANISHED:
            time.sleep(timeout)
            raise WireError(f"{kind} push to {VANISHED}: no answer within {timeout:.1f}s")
        self.inner.push(peer, kind, data, timeout=timeout)

    def events(self, *, max_items: int = 256, wait_s: float = 0.0) -> list[Event]:
        return self.inner.events(max_items=max_items, wait_s=wait_s)

    def stats(self):
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


def trainer_cfg(tmp: Path, name: str, args) -> TrainerConfig:
    return TrainerConfig.model_validate({
        **SMALL, "model": {**SMALL["model"], "cache_dir": str(tmp.parent / "cache")},
        "data_dir": str(tmp / name), "seed": 3, "run_id": "stall", "grpo": {"warmstart_steps": 30, "lr": 1e-3},
        "loco": {"inner_steps": 1, "deadline_s": args.deadline, "decision_wait_s": args.decision_wait},
        "rollout_wait_s": 0.0, "eval_every": 0, "genesis_wait_s": 1.0})


def seconds_per_version(tmp: Path, args, *, vanished: bool) -> tuple[float, list[float], int]:
    """Median wall time between consecutive versions on the live trainers (after the first two),
    those times, and how many rounds a live trainer's payload was left out of."""
    swarm = InProcessSwarm(wrap=lambda name, t: Hanging(t))
    if vanished:  # listed first: the dead peer was in the swarm before the others came
        swarm.hub.join(VANISHED, lambda request: None).publish(
            PeerStatus(role="trainer"))
    names = [f"trainer-{chr(ord('a') + i)}" for i in range(args.trainers)]
    dirs = [swarm.start(n, trainer_cfg(tmp, n, args)) for n in names]
    give_up = time.monotonic() + args.timeout
    try:
        while min(node_version(d) for d in dirs) < args.versions:
            if swarm.errors or time.monotonic() > give_up:
                raise SystemExit(f"swarm failed or stalled: {swarm.errors or 'timeout'}")
            time.sleep(0.2)
    finally:
        swarm.stop_all()
    gaps = []
    for d in dirs:
        at = sorted((h.version, h.at) for h in node_status(d).history)
        gaps += [b[1] - a[1] for a, b in itertools.pairwise(at) if a[0] >= 2 and b[0] <= args.versions]
    left_out = sum(node_status(d).trainer.rounds_left_out for d in dirs)
    return statistics.median(gaps), gaps, left_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainers", type=int, default=3, help="live trainers")
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--deadline", type=float, default=3.0, help="loco.deadline_s")
    ap.add_argument("--decision-wait", type=float, default=2.0, help="loco.decision_wait_s")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up on a run after this long")
    args = ap.parse_args()
    out: dict[str, Any] = {"bench": "loco_stall", "trainers": args.trainers, "deadline_s": args.deadline,
                           "decision_wait_s": args.decision_wait}
    with tempfile.TemporaryDirectory(prefix="loco-stall-") as tmp:
        for vanished in (False, True):
            label = "vanished" if vanished else "all_live"
            med, gaps, left_out = seconds_per_version(Path(tmp) / label, args, vanished=vanished)
            out[f"s_per_version_{label}"] = round(med, 2)
            out[f"payloads_left_out_{label}"] = left_out
            print(f"{label:>9}: {med:.2f} s/version (median of {len(gaps)}; min {min(gaps):.2f}, "
                  f"max {max(gaps):.2f}); live trainers' payloads left out of a round: {left_out}", flush=True)
    stall = out["s_per_version_vanished"] - out["s_per_version_all_live"] - args.deadline
    out["stall_beyond_deadline_s"] = round(stall, 2)
    out["ratio_vanished_vs_deadline_plus_all_live"] = round(
        out["s_per_version_vanished"] / (args.deadline + out["s_per_version_all_live"]), 2)
    print(f"a round with one vanished trainer waits {stall:.2f} s beyond the deadline it must wait "
          f"({out['ratio_vanished_vs_deadline_plus_all_live']:.2f}x deadline + an all-live round)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
