"""The JSON summary of ``pulse-node swarm`` (its last line with ``--json``; keys in the README).

Built from the swarm's ``SwarmSnapshot`` (the dashboard's) and each node's ``StatusReport``:
which version every node holds and whether their states agree there, held-out accuracy first
and last, and what PULSE saved: patch bytes against dense BF16 and against the reference codec
(grail v3.1), the BF16 changed fraction per version, catch-up patches against the patches they
replaced; every alert of the snapshot (``alerts``) and whether one of them fails the run
(``failed``: the kinds of ``FAILING_ALERTS`` present, so ``pulse-node swarm`` exits 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_node.daemon.status_model import StatusReport
from pulse_node.ops.snapshot import FIRST_PATCH_VERSION, SwarmSnapshot


def swarm_summary(snap: SwarmSnapshot, nodes: list[tuple[str, str, StatusReport | None]], *, run_dir: Path,
                  bootstrap: str) -> dict[str, Any]:
    """Versions every node holds and whether their states agree, learning, and what PULSE saved:
    totals from the first trainer's counters (every version it published), per-version figures
    from the snapshot (the last ``HISTORY_LEN`` versions), catch-ups from the inference histories."""
    trainers = [s for _, _, s in nodes if s is not None and s.trainer is not None]
    lead = trainers[0].trainer if trainers else None
    held = min((s.version if s is not None else -1 for _, _, s in nodes), default=-1)
    row = next((v for v in snap.versions if v.version == held), None)
    firsts = [s.first_eval for s in trainers if s.first_eval is not None]
    evals = [v.eval for v in snap.versions if v.eval is not None]
    patches = [v for v in snap.versions if v.version >= FIRST_PATCH_VERSION and v.changed is not None]
    patch, dense = (lead.patch_bytes_total, lead.dense_bytes_total) if lead else (0, 0)
    reference = lead.reference_bytes_total if lead else 0
    tot = snap.totals
    return {
        "versions": held,
        "nodes": [{"name": name, "role": role, "version": s.version if s else -1,
                   "state_hash": s.state_hash if s else "", "peer_id": s.peer_id if s else ""}
                  for name, role, s in nodes],
        "states_agree": row is None or row.agree is not False,
        "hash_disagreements": len(snap.hash_disagreements),
        "eval_first": min(firsts, key=lambda e: e.version).accuracy if firsts else None,
        "eval_last": evals[-1] if evals else None,
        "bytes_patch_total": patch,
        "bytes_dense_equivalent": dense,
        "bytes_reference_equivalent": reference,
        "smaller_than_dense": round(dense / patch, 2) if patch and dense else None,
        "smaller_than_reference": round(reference / patch, 2) if patch and reference else None,
        "changed_fraction_mean": round(sum(v.changed or 0 for v in patches) / len(patches), 6) if patches else None,
        "changed_fraction_max": round(max(v.changed or 0 for v in patches), 6) if patches else None,
        "catchups": tot.catchups,
        "catchup_bytes": tot.catchup_bytes,
        "catchup_replaced_bytes": tot.catchup_replaced_bytes,
        "rollouts_sent": sum(s.inference.rollouts_sent for _, _, s in nodes if s is not None and s.inference),
        "per_version": [v.model_dump(include={"version", "holders", "agree", "contributors", "patch_bytes",
                                              "dense_bytes", "reference_bytes", "changed", "reward", "eval"})
                        for v in snap.versions],
        "versions_without_contributors": [v.version for v in snap.versions if v.contributors == 0],
        "alerts": [a.model_dump(mode="json") for a in snap.alerts],
        "failed": sorted({a.kind for a in snap.alerts if a.failing}),
        "run_dir": str(run_dir),
        "bootstrap": bootstrap,
    }
