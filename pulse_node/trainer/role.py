"""The trainer role: GRPO inner steps, a PULSELoCo round with the other trainers, a new version.

One round (= one version):

1. ``inner_steps`` GRPO steps on rollouts pushed by inference nodes (within the staleness
   bound), taken round robin per sender and each batch verified before use (``trainer/intake.py``,
   ``rl/verify.py``: a refused batch does not use up a step); when none arrive within
   ``rollout_wait_s`` the trainer makes its own, so a swarm without inference nodes still trains.
2. The error-feedback gate turns ``global - local`` into a sparse payload, coded against the
   round's FP32 global weights (``loco.base_coding``) and pushed to every other trainer. The
   round's coordinator decides which payloads make up the round (a signed list,
   ``trainer/agreement.py``); every trainer averages exactly those in canonical order, and the
   outer Nesterov step updates the FP32 global weights bit-identically on every trainer. A
   trainer left out keeps its error feedback; one that cannot reproduce the decided set re-syncs.
3. The BF16 cast of the global weights is published as the next version (patch, signed record,
   anchor every N) and announced to inference nodes.
"""

from __future__ import annotations

import time

import torch

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import VersionRecord, decode_record, encode_record
from pulse_node.chain.verified import VerifiedVersion
from pulse_node.codec.state import State
from pulse_node.config import TrainerConfig, recording_problem
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.evidence_plane import EvidencePlane
from pulse_node.daemon.status_model import VersionEntry
from pulse_node.errors import ConfigError, IntegrityError, PulseError
from pulse_node.loco.bound import PayloadBound
from pulse_node.loco.decision import RoundDecision, encode_decision, payload_digest
from pulse_node.loco.ledger import RoundFacts
from pulse_node.loco.outer import OuterState
from pulse_node.loco.payload import LocoPayload, encode_payload
from pulse_node.loco.roundrules import unrevealed
from pulse_node.loco.verdicts import failing, ledger_facts, named_verdicts
from pulse_node.net.wire.protocol import TrainerStateRequest
from pulse_node.peers.outcomes import Fault, Relayed
from pulse_node.rl.assign import BatchKey
from pulse_node.rl.evaluate import evaluate
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.settings import ModelMismatch, check_declared_model, settings_of
from pulse_node.rl.tasks import make_task_source
from pulse_node.rl.verify import RolloutVerifier
from pulse_node.torchbits import module_state
from pulse_node.trainer.agreement import RoundAgreement, RoundResult
from pulse_node.trainer.engine import make_engine
from pulse_node.trainer.intake import RolloutFeed
from pulse_node.trainer.pace import OpenPace
from pulse_node.trainer.publisher import Published, VersionPublisher
from pulse_node.trainer.resync_quorum import gather_ballots, majority
from pulse_node.trainer.spot_round import SpotRounds
from pulse_node.trainer.state import export_trainer_state, read_trainer_state, trainer_state_cap
from pulse_node.trainer.trust_report import trust_report


class TrainerRole:
    """Runs rounds until stopped or ``max_versions`` is reached."""

    def __init__(self, ctx: RoleContext[TrainerConfig]) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        cfg = self.cfg
        if (problem := recording_problem(cfg)) is not None:
            raise ConfigError(problem)  # before the model is built: every trainer would refuse our commitments
        # the model seed is the run's (every trainer starts bit-identical); sampling differs per peer
        # model, optimizers, error feedback and outer step: in this process, or on the ranks of a
        # torchrun group (trainer/engine.py); outer.params are the whole FP32 global weights either way
        self.engine = make_engine(cfg, status=ctx.status)
        if cfg.faults.advantage_flip:  # TESTING ONLY: a trainer that trains on inverted advantages
            from pulse_node.testing.trainer_faults import flip_advantages

            flip_advantages(self.engine, log=ctx.log)
        self.tasks = make_task_source(cfg.task)
        self.eval_set = self.tasks.eval_set()
        self.outer = self.engine.outer
        self.global_params = self.outer.params
        self.shapes = self.engine.shapes
        self.publisher = VersionPublisher(ctx.store, ctx.identity, run_id=cfg.run_id, chain=cfg.chain,
                                          rollout_settings=settings_of(cfg))
        verifier = RolloutVerifier(self.engine.worker, self.tasks, run_id=cfg.run_id, cfg=cfg.verify,
                                   batches_per_version=cfg.rollout_batches_per_version,
                                   max_staleness=cfg.grpo.max_staleness)
        self.book = ctx.book  # what this node thinks of its peers: convicted members are refused for good
        self.gate = self.book.gate
        self.evidence = EvidencePlane(ctx)
        self.feed = RolloutFeed(verifier, cfg.verify, status=ctx.status, book=self.book)
        self.own_batches = 0
        self.agreement = RoundAgreement(ctx, shapes=self.shapes, current_round=lambda: self.outer.round, epoch=self._epoch,
                                        base=self._base, bound=PayloadBound.of_trainer(cfg), ledger=lambda: self.outer.ledger,
                                        verdicts=lambda r: self.spot.verdicts_for(r),  # noqa: PLW0108 (spot: made next)
                                        refutes=lambda v, before: self.spot.refutes(v, before=before),
                                        owed=lambda r, since: self.spot.owed(r, since=since),
                                        culprit=lambda v: self.spot.culprit(v),  # noqa: PLW0108 (spot: made next)
                                        inner_settings=lambda: self.spot.settings())  # noqa: PLW0108 (spot: made next)
        self.spot = SpotRounds(ctx, engine=self.engine, agreement=self.agreement, ledger=lambda: self.outer.ledger,
                               states=lambda: self.feed.states)
        self.pace = OpenPace(cfg.loco.inner_steps)
        self.peer_heads: dict[int, dict[str, str]] = {}  # version -> trainer -> state hash of its signed head
        self.published_hashes: dict[int, str] = {}

    @property
    def version(self) -> int:
        return self.publisher.head.version if self.publisher.head else -1

    # ---- lifecycle ---------------------------------------------------------------------
    def run(self) -> None:
        self._start_chain()
        while not self.ctx.stop.is_set():
            if self.cfg.max_versions is not None and self.version >= self.cfg.max_versions:
                self._idle_until_stopped()
                return
            self.round()

    def _start_chain(self) -> None:
        """Join the run: adopt a peer trainer's state, else resume our store, else publish genesis."""
        if any(self._resync(source, joining=True) for source in self._sync_sources()):
            return
        head, state = self.publisher.head, self.publisher.state
        if head is None or state is None:
            self._publish()
            return
        # alone with our own store: continue from it (BF16 -> FP32 is exact; FP32 residue is lost)
        self.engine.load_global(state, round=head.version)
        self.feed.keep_state(head.version, state)
        self._reset_local()
        self.ctx.log.info("resumed alone at version %d", head.version)
        self._announce()

    def _sync_sources(self) -> list[PeerRecord]:
        """The trainers to copy state from, most advanced first (each adopted only with a quorum,
        ``_resync``); none if we lead genesis.

        Trainers that start together wait ``genesis_wait_s`` to see each other; the one with the
        lowest peer id publishes genesis and the others adopt it, so all start bit-identical.
        """
        me = self.ctx.transport.peer_id
        self.ctx.announce(version=self.version, chain_hash="", state_hash="")
        start = time.monotonic()
        give_up = start + self.cfg.genesis_wait_s + self.cfg.net.fetch_timeout_s
        while not self.ctx.stop.is_set():
            trainers = self._member_trainers()  # a peer merely announcing the role leads nothing
            ahead = [p for p in trainers if p.head >= max(self.version, 0)]
            if ahead:
                return sorted(ahead, key=lambda p: (-p.head, p.peer_id))
            leader = min([me] + [p.peer_id for p in trainers])
            now = time.monotonic()
            if (leader == me and now > start + self.cfg.genesis_wait_s) or now > give_up:
                return []
            self.ctx.wait(0.2)
        return []

    def _member_trainers(self) -> list[PeerRecord]:
        """Live trainers that are members of the trainer set (by the key their peer id encodes)."""
        return list(self.book.live_trainers(self.ctx.peers()).values())

    def _resync(self, peer: PeerRecord, *, joining: bool = False) -> bool:
        """Adopt ``peer``'s FP32 global weights, momentum and head record; False if that failed.

        Only from a member of the trainer set, only a state a majority of the live members hold
        (``trainer/resync_quorum.py``; asked before the state is fetched), whose record a member
        signed for this run and that is not older than our own (a replayed old state is refused);
        checked before anything of ours is touched. The BF16 state becomes our store's current version.
        """
        try:
            if not any(p.peer_id == peer.peer_id for p in self._member_trainers()):
                raise IntegrityError(f"{peer.peer_id[:12]} is not a member of the trainer set")
            if peer.head < self.version:
                raise IntegrityError(f"{peer.peer_id[:12]} holds version {peer.head}, older than ours ({self.version})")
            agreed = self._quorum_state(peer.head, source=peer.peer_id)
            if agreed is None:
                raise IntegrityError(f"no majority of the trainer set holds a state at version {peer.head}")
            outer_state, record = self._fetch_trainer_state(peer)
            if record.version != peer.head:  # it moved on since it announced: ask again for that version
                agreed = self._quorum_state(record.version, source=peer.peer_id)
            if record.state_hash != agreed:
                raise IntegrityError(f"{peer.peer_id[:12]} serves version {record.version} ({record.state_hash[:12]}), "
                                     f"not the state a majority holds at {peer.head}")
            check_declared_model(record.rollout_settings, self.publisher.rollout_settings, version=record.version)
            state = module_state(outer_state["params"].items())
            adopted = self.book.ask(peer.peer_id, lambda: self.gate.admit(record, state=state))
            if isinstance(adopted, Fault):
                raise IntegrityError(f"state of {peer.peer_id[:12]} refused: {adopted.why}")
            self._adopt_into_store(adopted)
        except ModelMismatch as exc:
            if joining:
                raise  # the swarm runs another model: refuse to join rather than train on it
            self.ctx.status.error(f"re-sync from {peer.peer_id[:12]} refused: {exc}")
            return False
        except PulseError as exc:
            self.ctx.status.error(f"re-sync from {peer.peer_id[:12]} failed: {exc}")
            return False
        self.outer.load_state_dict(outer_state)
        self._reset_local()
        self.publisher.adopt(record, state)
        self.feed.forget_states()  # earlier states we hold may be another fork's
        self.feed.keep_state(record.version, state)
        self.ctx.status.record_version(VersionEntry(  # held too, with the outer state it came with
            version=record.version, state_hash=record.state_hash, global_hash=self.outer.state_hash().hex()))
        with self.ctx.status.trainer() as counters:
            counters.resyncs += 1
        self.ctx.log.info("adopted state of %s at version %d", peer.peer_id[:12], record.version)
        self._announce()
        return True

    def _adopt_into_store(self, adopted: VerifiedVersion) -> None:
        """Make ``adopted`` our store's current version, dropping our own fork if we had one."""
        record = adopted.record
        ours = self.ctx.store.record(record.version - 1)
        same = self.ctx.store.record(record.version)
        newer = any(v > record.version for v in self.ctx.store.versions())
        if newer or (ours is not None and ours.chain_hash != record.parent_chain_hash) or \
                (same is not None and same.chain_hash != record.chain_hash):
            self.ctx.store.discard_from(0)
        self.ctx.store.put_current(adopted)

    def _fetch_trainer_state(self, peer: PeerRecord) -> tuple[OuterState, VersionRecord]:
        if not any(p.peer_id == peer.peer_id for p in self._member_trainers()):
            raise IntegrityError(f"{peer.peer_id[:12]} is not a member of the trainer set")
        dest = self.ctx.store.root / f".trainer-state-{peer.peer_id[:16]}.part"
        try:
            self.ctx.transport.fetch(peer, TrainerStateRequest(), dest, timeout=self.cfg.net.fetch_timeout_s,
                                     max_bytes=trainer_state_cap(self.global_params))
            outer_state, record = read_trainer_state(dest, names=set(self.global_params), trust=self.cfg.loco.trust)
        finally:
            dest.unlink(missing_ok=True)
        verified = self.book.ask(peer.peer_id, lambda: self.gate.verify(record))
        if isinstance(verified, Fault):
            raise IntegrityError(f"state of {peer.peer_id[:12]} refused: {verified.why}")
        if record.version < self.version:
            raise IntegrityError(f"{peer.peer_id[:12]} serves the state of version {record.version}, older than "
                                 f"ours ({self.version})")
        return outer_state, record

    def _quorum_state(self, version: int, *, source: str = "") -> str | None:
        """The state hash a majority of the live members (and we, if we published it) hold at
        ``version``; ``source``'s record is checked (``PulseError`` if it is bad)."""
        ballots = gather_ballots(version=version, heads=self.peer_heads.get(version, {}), source=source,
                                 trainers=self._member_trainers(), book=self.book, fetch=self.ctx.transport.fetch,
                                 scratch=self.ctx.store.root, timeout=min(self.cfg.net.fetch_timeout_s, 5.0))
        me, mine = self.ctx.identity.public_key_hex, self.published_hashes.get(version)
        if mine:
            ballots[me] = mine
        return majority(ballots, me=me, depth=self._depth)

    def _depth(self, key: str) -> int | None:
        """A voter's class (``trainer/resync_quorum.py``); ours as the book would see our record."""
        if key == self.ctx.identity.public_key_hex:
            return self.book.own_depth(key, self.ctx.admission)
        return self.book.depth(key)

    def _take_head(self, sender: str, data: bytes) -> None:
        """A pushed head record counts (for ``_check_agreement``) only if it is the sender's own,
        signed by the key its peer id encodes, a trainer-set member, for this run."""
        rec = decode_record(data)
        self.ctx.peers()  # discovery read: the key a test-hub sender announces is known
        key = self.book.key_of(sender)
        if rec.signer != key or not self.book.is_member(key):
            raise IntegrityError(f"head record of {rec.short()} is not signed by its sender, a trainer-set member")
        verified = self.book.ask(sender, lambda: self.gate.verify(rec), then=Relayed())
        if isinstance(verified, Fault):
            raise IntegrityError(f"head record of {rec.short()} from {sender[:12]} refused: {verified.why}")
        self.peer_heads.setdefault(rec.version, {})[key] = rec.state_hash

    def _check_agreement(self) -> None:
        """Re-sync if a majority of the trainer set holds another state at a version we published.

        That repairs the one fork the contributor agreement leaves possible (``trainer/agreement.py``);
        one member's differing head is outvoted (``trainer/resync_quorum.py``).
        """
        me = self.ctx.identity.public_key_hex
        live = {self.book.key_of(p.peer_id): p for p in self._member_trainers()}
        for version in sorted(self.peer_heads):
            mine = self.published_hashes.get(version)
            heads = {k: h for k, h in self.peer_heads[version].items() if k in live}
            won = majority({**heads, me: mine}, me=me, depth=self._depth) if mine and heads else None
            if won is not None and won != mine:
                source = min((live[k] for k, h in heads.items() if h == won), key=lambda p: p.peer_id.encode())
                self.ctx.status.error(f"state differs from the majority at version {version}; re-syncing")
                self.peer_heads.clear()
                self._resync(source)
                return
        self.peer_heads = {v: h for v, h in self.peer_heads.items() if v > self.version - 8}

    def _idle_until_stopped(self) -> None:
        """Keep serving and announcing the final version until asked to stop."""
        while not self.ctx.wait(self.cfg.net.head_poll_s):
            self._drain_events()
            self._announce()

    # ---- one round ---------------------------------------------------------------------
    def _epoch(self) -> bytes:
        """The epoch of the chain we extend (``chain/record.py``); zeros (no decision has them) before we hold one."""
        head = self.publisher.head
        return bytes.fromhex(head.epoch) if head is not None else bytes(32)

    def _base(self) -> tuple[bytes, dict[str, torch.Tensor]]:
        """The current round's base: hash of (round, FP32 global weights, momentum), the weights."""
        return self.outer.state_hash(), self.outer.params

    def round(self) -> None:
        metrics: dict[str, float] = {}
        self.spot.begin(round=self.outer.round, base_hash=self.outer.state_hash())
        member = self.agreement.peers.i_am_member()  # an open trainer keeps pace (trainer/pace.py)
        for step in range(self.cfg.loco.inner_steps if member else self.pace.steps):
            if self.ctx.stop.is_set():
                return
            if step and not member and self.agreement.closed_elsewhere(self.outer.round):
                break
            try:
                batch, producer = self._next_batch()
                metrics = self.engine.step(batch, current_version=self.version, producer=producer)
            except PulseError as exc:  # a malformed batch from a peer: drop it, keep training
                with self.ctx.status.node() as counters:
                    counters.rejected += 1
                self.ctx.status.error(f"rollout batch rejected: {exc}")
                continue
            with self.ctx.status.trainer() as counters:
                counters.rollouts_used += int(metrics.get("kept", 0))
        contributors = self._loco_round()
        if contributors is None:  # re-synced (or stopping): the adopted version is already ours
            return
        self._reset_local()
        pub = self._publish(reward=float(metrics.get("reward_mean", 0.0)) if metrics else None, contributors=contributors)
        self._check_agreement()
        self.ctx.status.update(reward_mean=float(metrics.get("reward_mean", 0.0)), contributors=contributors)
        with self.ctx.status.trainer() as counters:
            counters.rounds = self.outer.round
        self.ctx.log.info("version %d: %d contributors, patch %d B (%.4f changed), reward %.3f",
                          self.version, contributors, pub.patch_bytes, pub.changed_fraction,
                          metrics.get("reward_mean", 0.0))

    def _loco_round(self) -> int | None:
        """Agree on this round's payloads and take the outer step; returns #contributors.

        None when the round ended in a re-sync (or the trainer is stopping) instead.
        """
        round_no = self.outer.round
        base_hash, base = self._base()
        mine = self.engine.make_payload(round=round_no, trainer_id=self.ctx.transport.peer_id, base_hash=base_hash)
        with self.ctx.status.trainer() as counters:
            counters.loco_clipped += getattr(getattr(self.engine, "ef", None), "clipped", 0)
        data = encode_payload(mine, level=self.cfg.loco.zstd_level,
                              base=base if self.cfg.loco.base_coding else None)
        result = self._agree(mine, data, spot=self.spot.commitment(round_no, data))
        if result.payloads is not None and self._apply(round_no, result.payloads, result.decision):
            named = result.decision is not None and mine.trainer_id in result.decision.commitments
            self.pace.saw(in_time=result.mine_included or named)  # named: in time, not drawn
            if not result.mine_included:
                self.engine.restore(mine)
                with self.ctx.status.trainer() as counters:
                    counters.rounds_left_out += 1
            elif (keep := self.outer.kept.get(mine.trainer_id, 1.0)) < 1.0:
                self.engine.restore(mine, keep=keep)  # the part the aggregation did not apply
            return len(result.payloads)
        if self.ctx.stop.is_set():
            return None
        self.engine.restore(mine)  # our work was not applied: it stays in the error feedback
        if self._resync_after(round_no):
            return None
        with self.ctx.status.trainer() as counters:
            counters.forks += 1
        self.ctx.status.error(f"round {round_no}: cannot reproduce the decided payloads nor re-sync; "
                              "closing it without an update until the agreement check repairs the fork")
        self.outer.apply([])
        return 0

    def _agree(self, mine: LocoPayload, data: bytes, *, spot: bytes) -> RoundResult:
        """Drive the contributor agreement of this round, handing it what peers push meanwhile."""
        self.agreement.open_round(mine, data, spot=spot)
        while (result := self.agreement.step()) is None:
            self._drain_events(wait_s=self.agreement.idle_s)
        return result

    def _apply(self, round_no: int, payloads: list[LocoPayload], decision: RoundDecision | None) -> bool:
        """The outer step on the decided payloads, weighted by the trust ledger, which then
        records what the decision names (``loco/ledger.py``); the round's spot checks are drawn first
        (``trainer/spot_round.py``)."""
        trust, facts = None, None
        if decision is not None:
            ids = decision.trainer_ids
            members = frozenset(ids) - frozenset(decision.open)
            trust = self.outer.ledger.weights(ids, members=members)
            silent = unrevealed(decision.commitments, contributors=ids, members=members, ledger=self.outer.ledger,
                                failed=failing(named_verdicts(decision), self.outer.ledger,
                                               convicted=decision.convicted))
            verdicts, convicted = ledger_facts(decision)
            facts = RoundFacts(round_no, digest=payload_digest(encode_decision(decision)), contributors=tuple(ids),
                               members=members, unrevealed=silent, verdicts=verdicts, convicted=convicted)
            self.spot.decided(decision, base=self.outer.params)
        try:
            self.outer.apply(payloads, trust=trust, facts=facts)
            self.spot.applied(round_no, self.outer)
            self.ctx.status.update(trust=trust_report(self.outer.ledger, self.outer.trust))
        except PulseError as exc:  # decided payloads that do not fit our state: re-sync
            self.ctx.status.error(f"round {round_no}: {exc}")
            return False
        return True

    def _resync_after(self, round_no: int) -> bool:
        """Adopt the state of a trainer that finished ``round_no``, waiting a bounded time for one."""
        give_up = time.monotonic() + self.cfg.loco.decision_wait_s + self.cfg.net.fetch_timeout_s
        while not self.ctx.stop.is_set() and time.monotonic() < give_up:
            done = [p for p in self._member_trainers() if p.head > round_no]
            if any(self._resync(p) for p in sorted(done, key=lambda p: (-p.head, p.peer_id))):
                return True
            self._drain_events(wait_s=0.2)
        return False

    def _reset_local(self) -> None:
        self.engine.reset_local()

    def _publish(self, reward: float | None = None, contributors: int | None = None) -> Published:
        state = module_state(self.global_params.items())
        pub = self.publisher.publish(state)
        self.feed.keep_state(pub.record.version, state)
        with self.ctx.status.trainer() as counters:
            counters.patch_bytes_total += pub.patch_bytes
            counters.dense_bytes_total += pub.dense_bytes if pub.record.version > 0 else 0
            counters.reference_bytes_total += pub.reference_bytes or 0
        accuracy = None
        if self.cfg.eval_every and pub.record.version % self.cfg.eval_every == 0:
            accuracy = self._evaluate(state, pub.record.version)
            self.ctx.status.update(eval_accuracy=accuracy)
        self.ctx.status.record_version(VersionEntry(
            version=pub.record.version, state_hash=pub.record.state_hash, patch_bytes=pub.patch_bytes,
            dense_bytes=pub.dense_bytes, reference_bytes=pub.reference_bytes, changed=pub.changed_fraction,
            global_hash=self.outer.state_hash().hex(), reward=reward, eval=accuracy,  # reward: of its batches
            contributors=contributors))
        self.published_hashes[pub.record.version] = pub.record.state_hash
        self.gate.saw(pub.record)  # our own versions are the version step's reference, too
        self.published_hashes = {v: h for v, h in self.published_hashes.items() if v > pub.record.version - 8}
        export_trainer_state(self.ctx.store.root, params=self.global_params, momentum=self.outer.momentum,
                             record=pub.record, ledger=self.outer.ledger, outer_hash=self.outer.state_hash())
        self._announce(push=True)
        return pub

    def _evaluate(self, state: State, version: int) -> float:
        self.engine.worker.set_weights(state, version)
        return float(evaluate(self.engine.worker, self.eval_set))

    def _announce(self, push: bool = False) -> None:
        head = self.publisher.head
        if head is None:
            return
        self.ctx.announce(version=head.version, chain_hash=head.chain_hash, state_hash=head.state_hash)
        if push and self.agreement.peers.i_am_member():  # an open trainer's versions are nobody's to follow
            # inference nodes learn the head, trainers compare states; in the background, members
            # and peers with standing first: a peer that never answers cannot hold the version back
            self.ctx.push_in_background("head", encode_record(head), self.ctx.peers())

    # ---- inputs ------------------------------------------------------------------------
    def _drain_events(self, wait_s: float = 0.0) -> None:
        self.evidence.tick()
        self.spot.tick()
        self.ctx.take_events({"rollouts": self.feed.offer, "head": self._take_head,
                              "loco": self.agreement.offer_payload, "loco_commit": self.agreement.offer_commit,
                              "loco_decision": self.agreement.offer_decision, "evidence": self.evidence.take,
                              "spot_answer": self.spot.offer_answer, "spot_verdict": self.spot.offer_verdict,
                              "spot_evidence": self.spot.offer_evidence}, wait_s=wait_s)

    def _next_batch(self) -> tuple[list[Rollout], str]:
        """A verified batch of peer rollouts, or our own after ``rollout_wait_s``; and who made it."""
        deadline = time.monotonic() + self.cfg.rollout_wait_s
        while True:
            self._drain_events()
            batch = self.feed.next_batch(self.version)
            if batch is not None:
                return batch, self.feed.sender
            if time.monotonic() >= deadline or not self.ctx.peers("inference"):
                return self._own_batch(), self.ctx.transport.peer_id
            self._drain_events(wait_s=0.05)

    def _own_batch(self) -> list[Rollout]:
        """A batch made here with the seeded sampler (trusted: not verified)."""
        worker = self.engine.worker
        if worker.loaded is not self.publisher.state and self.publisher.state is not None:
            worker.set_weights(self.publisher.state, self.version)
        self.own_batches += 1
        key = BatchKey(self.cfg.run_id, worker.version, self.ctx.transport.peer_id, self.own_batches)
        rollouts = worker.generate_batch(self.tasks, key)
        with self.ctx.status.trainer() as counters:
            counters.rollouts_own += len(rollouts)
        return rollouts

    def close(self) -> None:
        self.spot.close()
        self.ctx.close()
        self.engine.close()
