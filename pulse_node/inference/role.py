"""The inference role: hold the newest trusted version, make rollouts with it, send them back.

Each pass of the loop: take pushed head announcements, let ``VersionSync`` fetch/verify/apply
what is missing (re-serving it through the store), tell peers what we now hold, then generate
one batch of scored rollouts with exactly the version we hold and push it to a trainer
(round robin, in the background: ``RoleContext.push_in_background``). Batch ``b`` of version ``v`` answers the prompts assigned to (run, v, our peer
id, b), with the seeded sampler, for ``b < rollout_batches_per_version`` (``rl/assign.py``,
``rl/seeded.py``), so trainers can verify it (``rl/verify.py``). We generate only for versions
whose signed record declares the rollout settings of our config (``rl/settings.py``).
"""

from __future__ import annotations

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import encode_record
from pulse_node.config import InferenceConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.evidence_plane import EvidencePlane
from pulse_node.daemon.status_model import VersionEntry
from pulse_node.errors import PulseError
from pulse_node.inference.streaming import Pipeline
from pulse_node.inference.syncer import VersionSync
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.config import GRPOConfig
from pulse_node.rl.liveweights import LiveWeights
from pulse_node.rl.policy import build_policy
from pulse_node.rl.rollout import encode_rollouts
from pulse_node.rl.sampler import RolloutWorker
from pulse_node.rl.settings import SettingsMismatch, check_settings, settings_of
from pulse_node.rl.tasks import make_task_source

#: rollout batches waiting for the background pusher, at most
ROLLOUT_JOBS = 4


class InferenceRole:
    """Runs until stopped (or until ``max_versions`` is held, then keeps serving)."""

    def __init__(self, ctx: RoleContext[InferenceConfig]) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        cfg = self.cfg
        self.book = ctx.book  # what this node thinks of its peers: convicted members refused for good
        self.evidence = EvidencePlane(ctx)
        self.sync = VersionSync(ctx.store, ctx.transport, self.book, net=cfg.net,
                                catchup_min_gap=cfg.chain.catchup_min_gap, catchup_wait_s=cfg.chain.catchup_wait_s)
        # weights come from the swarm: only the architecture and tokenizer are needed here
        policy = build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=GRPOConfig(warmstart_steps=0))
        self.worker = RolloutWorker(policy, cfg.sampling, compute=cfg.compute, decode=cfg.decode)
        del policy  # the worker holds its own copy; a second network would cost 4 B/param for nothing
        # it only moves forward: no undo steps kept beside the live model (bytes per parameter)
        self.worker.live = LiveWeights(dict(self.worker.lm.module.named_parameters()), keep=0)
        # the next version decoded, hashed and written into the live model while its bytes arrive
        self.sync.pipeline = Pipeline(self.worker.live)
        self.tasks = make_task_source(cfg.task)
        self.sent_for: dict[int, int] = {}
        self.settings = settings_of(cfg)
        self.refused_version = -1  # the last version whose declared settings differ from ours
        self._next_trainer = 0
        if self.sync.record is not None:
            self.book.gate.saw(self.sync.record)  # the version step's reference before any peer's record

    def run(self) -> None:
        rec = self.sync.record
        self.ctx.announce(version=rec.version if rec else -1, chain_hash=rec.chain_hash if rec else "",
                          state_hash=rec.state_hash if rec else "")
        busy = False
        while not self.ctx.stop.is_set():
            # idle: block up to 0.5 s on pushed head announcements instead of polling
            self.evidence.tick()
            self.ctx.take_events({"evidence": self.evidence.take, "head": self.sync.take_head},
                                 wait_s=0.0 if busy else 0.5)
            peers = self.ctx.peers()
            applied = self.sync.step(peers, rank=self._rank(peers))
            if self.sync.record is not None and self.sync.record.version != self.worker.version:
                self._on_applied(applied)
            busy = self._rollout_once(peers)

    def _rank(self, peers) -> int:
        """Our position among inference peers that showed themselves (standing, or a verified head
        pushed to us): decides who fetches fresh versions from trainers. Fresh keys merely
        announcing the role cannot push us out of the seeds."""
        shown = [p.peer_id for p in peers if p.role == "inference" and
                 (self.book.known(p.peer_id) or p.peer_id in self.sync.hints)]
        ids = sorted(shown + [self.ctx.transport.peer_id])
        return ids.index(self.ctx.transport.peer_id)

    def _on_applied(self, applied) -> None:
        rec, state = self.sync.record, self.sync.state
        if rec is None or state is None:
            return  # nothing held: an apply always leaves a version, so this does not happen
        # the steps just applied in place, scattered into the live model (a reload only after an anchor)
        self.worker.set_weights(state, rec.version, changes=self.sync.take_changes())
        self.ctx.store.retain(keep_versions=self.cfg.chain.keep_versions, keep_anchors=self.cfg.chain.keep_anchors)
        # the history and counters first: a status that says version v holds v's entry and counts
        # v's apply (readers wait on the version)
        caught = self.sync.last_catchup
        if rec.version not in {r.version for r in applied}:  # reached by an anchor: held all the same
            self.ctx.status.record_version(VersionEntry(version=rec.version, state_hash=rec.state_hash))
        for r in applied:
            by_catchup = caught if caught is not None and caught.target == r.version else None
            self.ctx.status.record_version(VersionEntry(
                version=r.version, state_hash=r.state_hash,
                patch_bytes=by_catchup.patch_bytes if by_catchup else r.patch_bytes,
                catchup_from=by_catchup.base if by_catchup else None))
        n = self.sync.counters
        with self.ctx.status.inference() as c:
            c.patches_applied, c.patch_bytes_total, c.gaps = n.patches_applied, n.patch_bytes_total, n.gaps
            c.fetch_errors, c.apply_errors, c.anchor_loads = n.fetch_errors, n.apply_errors, n.anchor_loads
            c.catchups, c.catchup_misses, c.catchup_bytes_total = n.catchups, n.catchup_misses, n.catchup_bytes_total
            c.strikes, c.bans = dict(self.book.strikes), dict(self.book.bans)
        with self.ctx.status.node() as counters:
            counters.rejected = self.book.rejected
        self.ctx.announce(version=rec.version, chain_hash=rec.chain_hash, state_hash=rec.state_hash)
        # in the background: applying never waits on a peer that does not answer
        self.ctx.push_in_background("head", encode_record(rec), self.ctx.peers("inference"))
        self.ctx.log.info("holding version %d (%s)", rec.version, rec.state_hash[:12])

    def _rollout_once(self, peers) -> bool:
        """Generate and push one batch if we hold a version and owe rollouts for it."""
        rec = self.sync.record
        trainers = [p for p in peers if p.role == "trainer" and self.book.vouches_for(p)]  # members only
        if rec is None or not trainers:
            return False
        batch = self.sent_for.get(rec.version, 0)
        if batch >= self.cfg.rollout_batches_per_version or not self._settings_agree(rec):
            return False
        key = BatchKey(self.cfg.run_id, rec.version, self.ctx.transport.peer_id, batch)
        rollouts = self.worker.generate_batch(self.tasks, key)
        trainer = trainers[self._next_trainer % len(trainers)]
        self._next_trainer += 1
        reward = sum(r.reward for r in rollouts) / max(len(rollouts), 1)

        def sent(_peer: PeerRecord) -> None:
            with self.ctx.status.inference() as counters:
                counters.rollouts_sent += len(rollouts)
            self.ctx.status.update(reward_mean=reward)

        def failed(peer: PeerRecord, exc: PulseError) -> None:
            self.ctx.status.error(f"rollout push to {peer.peer_id[:12]} failed: {exc}")

        # in the background, like every push: generating the next batch never waits on a trainer;
        # at most ROLLOUT_JOBS batches wait (a newer one takes the place of the oldest waiting)
        self.ctx.push_in_background("rollouts", encode_rollouts(rollouts), [trainer], job=f"rollouts:{batch % ROLLOUT_JOBS}",
                                    timeout=30.0, newcomers=1, on_sent=sent, on_error=failed)
        self.sent_for = {v: n for v, n in self.sent_for.items() if v > rec.version - 8} | {rec.version: batch + 1}
        return True

    def _settings_agree(self, rec) -> bool:
        """Whether ``rec`` declares our rollout settings; says why not in the status (once per version)."""
        try:
            check_settings(rec.rollout_settings, self.settings, version=rec.version)
        except SettingsMismatch as exc:
            if self.refused_version != rec.version:
                self.refused_version = rec.version
                self.ctx.status.update(rollout_settings_error=str(exc))
                self.ctx.status.error(f"not generating rollouts: {exc}")
            return False
        if self.refused_version >= 0:
            self.refused_version = -1
            self.ctx.status.update(rollout_settings_error="")
        return True

    def close(self) -> None:
        self.ctx.close()
        self.sync.close()
