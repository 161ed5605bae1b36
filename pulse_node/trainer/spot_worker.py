"""Spot checks and evidence re-checks off the round's critical path: one background thread.

A verifier's check (``SpotChecker.check``: one forward and backward on the drawn step, the
replay at the opened leaves) and a re-check of someone's evidence (``recheck``) each cost about
an inner step; ``SpotWorker`` runs them one at a time on its own thread, on its own copy of the
model (never the trainer's), so the trainer's inner steps go on meanwhile. The trainer hands a
job over (``check``, ``recheck``) and collects what finished (``done``) from its loop; nothing
here touches the network or the trainer's state.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pulse_node.chain.identity import Identity
from pulse_node.codec.state import State
from pulse_node.config import TrainerConfig
from pulse_node.loco.spot_evidence import SpotEvidence
from pulse_node.loco.spotdraw import SpotDraw
from pulse_node.trainer.recompute import RoundBase, SpotCase, SpotChecker, SpotFailure, SpotUnavailable, SpotVerdict
from pulse_node.trainer.spot_evidence import RecheckResult, accuse, recheck

log = logging.getLogger("pulse.spot")
MAX_QUEUED = 64  # jobs waiting at most (each is a drawn check or a received evidence)


@dataclass
class Finished:
    """A finished job: a check of ours (``verdict``, and ``evidence`` if it failed on the target's
    data) or a re-check of someone's evidence (``recheck``), keyed as it was handed over."""

    kind: Literal["check", "recheck"]
    key: tuple[int, str, str] | bytes  # (round, target, verifier) of a check; the evidence digest of a re-check
    verdict: SpotVerdict | None = None
    evidence: SpotEvidence | None = None
    recheck: RecheckResult | None = None
    seconds: float = 0.0  # what the job took (wall time on the worker's thread)


class SpotWorker:
    """One thread running checks and re-checks in the order handed over (module docstring)."""

    def __init__(self, cfg: TrainerConfig, identity: Identity, *, me: str) -> None:
        self.cfg, self.identity, self.me = cfg, identity, me
        self._jobs: queue.Queue[Callable[[], Finished] | None] = queue.Queue(maxsize=MAX_QUEUED)
        self._done: list[Finished] = []
        self._lock = threading.Lock()
        self._checker: SpotChecker | None = None
        self._thread = threading.Thread(target=self._run, name="spot-checks", daemon=True)
        self._thread.start()

    def checker(self) -> SpotChecker:
        """The checker on this worker's own copy of the model (built on first use, on this thread)."""
        if self._checker is None:
            from pulse_node.rl.grpo import GRPOLearner
            from pulse_node.rl.policy import build_policy
            from pulse_node.rl.sampler import RolloutWorker
            from pulse_node.rl.tasks import make_task_source

            cfg = self.cfg
            policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=cfg.grpo)
            learner = GRPOLearner(policy, cfg.grpo, temperature=cfg.sampling.temperature)
            worker = RolloutWorker(policy, cfg.sampling, compute=cfg.verify.compute)
            self._checker = SpotChecker(learner, worker, make_task_source(cfg.task), run_id=cfg.run_id,
                                        loco=cfg.loco, verify=cfg.verify)
        return self._checker

    def check(self, draw: SpotDraw, case: SpotCase, base: RoundBase, *, payload_bytes: bytes,
              state_of: Callable[[int], State | None]) -> bool:
        """Queue our check ``draw`` of ``case``; False if the queue is full (the check is not run)."""
        def job() -> Finished:
            try:
                verdict = self.checker().check(draw, case, base, state_of=state_of)
            except SpotUnavailable as exc:
                verdict = SpotVerdict(draw, SpotFailure.UNANSWERED, f"cannot run here: {exc}")
            evidence = None
            if verdict.reason not in (None, SpotFailure.UNANSWERED, SpotFailure.SETTINGS):
                evidence = accuse(self.identity, accuser=self.me, run_id=self.cfg.run_id, verdict=verdict, case=case,
                                  payload_bytes=payload_bytes)
            return Finished("check", (draw.round, draw.target, draw.verifier), verdict, evidence)
        return self._put(job)

    def recheck(self, digest: bytes, ev: SpotEvidence, base: RoundBase, *, key_of: Callable[[str], str],
                state_of: Callable[[int], State | None]) -> bool:
        """Queue a re-check of evidence ``ev`` (of digest ``digest``); False if the queue is full."""
        def job() -> Finished:
            result = recheck(ev, checker=self.checker(), base=base, state_of=state_of, key_of=key_of)
            return Finished("recheck", digest, recheck=result)
        return self._put(job)

    def _put(self, job: Callable[[], Finished]) -> bool:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            return False
        return True

    def done(self) -> list[Finished]:
        """The jobs finished since the last call."""
        with self._lock:
            out, self._done = self._done, []
        return out

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            t0 = time.perf_counter()
            try:
                result = job()
                result.seconds = time.perf_counter() - t0
            except Exception:  # a bug or a hostile input this job did not foresee: logged, the worker goes on
                log.exception("spot check failed unexpectedly")
                continue
            with self._lock:
                self._done.append(result)

    def close(self) -> None:
        try:
            self._jobs.put_nowait(None)
        except queue.Full:
            pass
