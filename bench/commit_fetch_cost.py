"""What checking that a decision names only commitments held here costs a member when all are held.

    python bench/commit_fetch_cost.py [--trainers 8 64] [--repeats 2000]

A member's agreement on one in-memory hub (``tests/helpers.hub_agreement``, spot checks on) holds
the signed round commitments (with inner commitments) of ``--trainers`` members, each also served
by digest (``loco_commit``); a decision names every one of them. Side by side in one process,
alternating, CPU seconds (``time.process_time``) per call:

- ``standing``: ``DecisionIntake._standing`` on that decision (the rules a decision passes before
  it is accepted), with the new step (``_named_held``: nothing to fetch) and with it stubbed out
  (the code path before it);
- ``keep``: ``CommitIntake`` taking one pushed commitment (``offer_commit``: checks, hold, relay),
  with the file the wire worker serves it from written (``_serve``) and with that stubbed out
  (noisy: the relays' background threads count too); ``serve``: that file write alone
  (``time.thread_time``).

Run with another tree's ``pulse_node`` first on ``PYTHONPATH`` (one without the step, e.g. the
commit before it), the same workload is measured there: both modes are that tree's code path.
Last line: JSON with the per-call times and ratios (new / old).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from helpers import hub_agreement, inner_commitment  # noqa: E402

from pulse_node.chain.identity import Identity  # noqa: E402
from pulse_node.chain.peer import PeerStatus  # noqa: E402
from pulse_node.loco.decision import make_decision, payload_digest  # noqa: E402
from pulse_node.loco.payload import LocoPayload, encode_payload  # noqa: E402
from pulse_node.loco.roundcommit import commit_digest, encode_commit, make_commit  # noqa: E402
from pulse_node.testing.adversaries import peer_id  # noqa: E402
from pulse_node.testing.memory import MemoryHub  # noqa: E402
from pulse_node.trainer.decisions import coordinator_order  # noqa: E402
from pulse_node.vocab import DEFAULT_RUN_ID  # noqa: E402

ROUND, BASE, EPOCH, SETTINGS = 3, b"\x01" * 32, b"\x0e" * 32, b"\x5e" * 32
W = {"w": (np.random.default_rng(0).standard_normal(64) * 0.02).astype(np.float32)}


def _payload(trainer: str) -> bytes:
    p = LocoPayload(round=ROUND, trainer_id=trainer, base_hash=BASE, numel={"w": 64},
                    tensors={"w": (np.array([1, 5, 9], np.int64), np.array([1e-4, -1e-4, 1e-4], np.float32))})
    return encode_payload(p, base=W)


def _commit(ident: Identity) -> bytes:
    pid = peer_id(ident)
    digest = payload_digest(_payload(pid))
    spot = inner_commitment(ident, pid, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, payload=digest, params=64,
                            settings=SETTINGS, steps=4, batches=4)
    return encode_commit(make_commit(ident, run_id=DEFAULT_RUN_ID, epoch=EPOCH, round=ROUND, base=BASE, trainer=pid,
                                     payload=digest, spot=spot))


def _per_call(fn: Callable[[], object], repeats: int) -> float:
    t = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - t) / repeats


def measure(tmp: Path, n: int, repeats: int) -> dict[str, float]:
    keys = [Identity.generate() for _ in range(n)]
    by_id = {peer_id(k): k for k in keys}
    order = coordinator_order(DEFAULT_RUN_ID, ROUND, by_id)
    me, coordinator = by_id[order[1]], by_id[order[0]]
    hub = MemoryHub()
    ag = hub_agreement(tmp, hub, me, {"loco": {"inner_steps": 4, "spot": {"keyed": True, "rate": 0.3}},
                                      "chain": {"trusted_trainers": [k.public_key_hex for k in keys]}},
                       round=ROUND, epoch=EPOCH, base=(BASE, W), shapes={"w": (64,)}, inner_settings=lambda: SETTINGS)
    commits = {}
    for k in keys:
        if k is not me:
            hub.join(peer_id(k), lambda request: None).publish(PeerStatus(role="trainer", version=ROUND,
                                                                         node_key=k.public_key_hex))
            commits[peer_id(k)] = _commit(k)
            ag.offer_commit(peer_id(k), commits[peer_id(k)])
    ag.open_round(LocoPayload(round=ROUND, trainer_id=ag.me, base_hash=BASE), _payload(ag.me))
    named = {t: commit_digest(h.data) for t, h in ag.commits.round(ROUND).items()}
    d = make_decision(coordinator, run_id=DEFAULT_RUN_ID, round=ROUND, base=BASE, epoch=EPOCH, coordinator=order[0],
                      contributors={t: payload_digest(_payload(t)) for t in named}, committed=named)
    intake, cid = ag.intake, order[0]
    new = hasattr(intake, "_named_held")  # else a tree before the step: both modes run its code
    standing = (lambda: intake._standing(d, elsewhere=False, sender=cid)) if new else \
        (lambda: intake._standing(d, elsewhere=False))  # type: ignore[call-arg]
    assert standing() is None, "the decision is not acceptable as built"
    real_step, real_serve = (intake._named_held, ag.commits._serve) if new else (None, None)
    out: dict[str, list[float]] = {"standing_new": [], "standing_old": [], "keep_new": [], "keep_old": []}
    victim = next(iter(commits))
    for _ in range(5):  # alternating, best of 5
        for mode in ("new", "old"):
            if new:
                intake._named_held = real_step if mode == "new" else (lambda d, *, sender: None)  # type: ignore[method-assign]
                ag.commits._serve = real_serve if mode == "new" else (lambda r, data: None)  # type: ignore[method-assign]
            out[f"standing_{mode}"].append(_per_call(standing, repeats))

            def keep() -> None:
                ag.commits.held[ROUND].pop(victim)
                ag.offer_commit(victim, commits[victim])
            out[f"keep_{mode}"].append(_per_call(keep, max(1, repeats // 10)))
    if new:
        data, t = commits[victim], time.thread_time()
        for _ in range(repeats):
            real_serve(ROUND, data)
        out["serve"] = [(time.thread_time() - t) / repeats]
    ag.ctx.store.close()
    best = {k: min(v) for k, v in out.items()}
    return {"trainers": n, **{f"{k}_us": round(v * 1e6, 2) for k, v in best.items()},
            "standing_ratio": round(best["standing_new"] / best["standing_old"], 3),
            "keep_ratio": round(best["keep_new"] / best["keep_old"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainers", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--repeats", type=int, default=2000)
    args = ap.parse_args()
    results = []
    for n in args.trainers:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure(Path(tmp), n, args.repeats)
        print(f"{n:4d} trainers: standing {r['standing_new_us']:8.1f} us vs {r['standing_old_us']:8.1f} us before "
              f"(x{r['standing_ratio']}), taking a commitment {r['keep_new_us']:8.1f} us vs {r['keep_old_us']:8.1f} us "
              f"(x{r['keep_ratio']})" + (f", its file {r['serve_us']:.1f} us" if "serve_us" in r else ""))
        results.append(r)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
