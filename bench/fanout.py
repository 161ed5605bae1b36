"""Fan-out of one version to many inference nodes: does the trainer's upload stay flat?

    python bench/fanout.py [--inference 8] [--versions 6] [--json-only]

Runs a real local swarm (1 bootstrap, 1 trainer, N inference processes on 127.0.0.1; rollouts
off so only weight sync moves) and reports, side by side in one run:
- trainer upload of patch bytes per version / patch size (target <= 2: peers re-serve),
  and the same ratio for records and anchors;
- time from the trainer's publication to the moment all N nodes hold the version.
Last line: a JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulse_node.config import SwarmConfig
from pulse_node.swarm.launcher import LocalSwarm


def run(n_inference: int, versions: int, run_dir: Path) -> dict:
    cfg = SwarmConfig.model_validate({
        "trainers": 1, "inference": n_inference, "versions": versions, "run_dir": str(run_dir),
        "run_id": "bench-fanout", "rollout_batches_per_version": 0, "eval_every": 0, "rollout_wait_s": 0,
        "loco": {"inner_steps": 2}, "chain": {"anchor_every": 1000},
        "grpo": {"warmstart_steps": 50},
    })
    swarm = LocalSwarm(cfg, log=lambda m: None)
    t0 = time.monotonic()
    try:
        swarm.start()
        swarm.wait_versions(versions, on_tick=lambda: None, stop=lambda: time.monotonic() - t0 > 1800)
        time.sleep(1.0)  # let the last status.json writes land
        stats = {c.name: s for c, s in swarm.statuses()}
    finally:
        swarm.stop()
    trainer = stats["trainer-0"]
    published = {h.version: h for h in trainer.history}
    patch_total = sum(h.patch_bytes for v, h in published.items() if v > 0)
    out_by_kind = trainer.data_plane.bytes_out_by_kind
    lat = []
    for v, h in published.items():
        if v == 0:
            continue
        got = [next((x.at for x in stats[f"inference-{i}"].history if x.version == v), None)
               for i in range(n_inference)]
        if all(g is not None for g in got):
            lat.append(max(got) - h.at)
    dense = published[max(published)].dense_bytes or 0
    return {
        "inference_nodes": n_inference, "versions": versions,
        "patch_bytes_per_version": patch_total / max(len(published) - 1, 1),
        "dense_bytes_per_version": dense,
        "trainer_patch_upload_ratio": out_by_kind.get("patch", 0) / max(patch_total, 1),
        "trainer_anchor_upload_ratio": out_by_kind.get("anchor", 0) / max(dense, 1),
        "trainer_upload_bytes_by_kind": out_by_kind,
        "seconds_publish_to_all_median": statistics.median(lat) if lat else None,
        "seconds_publish_to_all_max": max(lat) if lat else None,
        "inference_patch_bytes_out": {n: s.data_plane.bytes_out_by_kind.get("patch", 0)
                                      for n, s in stats.items() if n.startswith("inference")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inference", type=int, default=8)
    ap.add_argument("--versions", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pulse-fanout-") as tmp:
        res = run(args.inference, args.versions, Path(tmp))
    print(f"inference nodes: {res['inference_nodes']}, versions: {res['versions']}")
    print(f"patch per version: {res['patch_bytes_per_version']:.0f} B (dense BF16 {res['dense_bytes_per_version']} B)")
    print(f"trainer patch upload / patch size: {res['trainer_patch_upload_ratio']:.2f} (target <= 2)")
    print(f"trainer anchor upload / anchor size: {res['trainer_anchor_upload_ratio']:.2f} (genesis anchor)")
    print(f"publish -> all {res['inference_nodes']} hold it: median {res['seconds_publish_to_all_median']} s,"
          f" max {res['seconds_publish_to_all_max']} s")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
