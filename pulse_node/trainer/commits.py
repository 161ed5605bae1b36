"""The commit phase of a round: signed round commitments, made, checked, kept and relayed.

Before anyone reveals a payload of round ``r``, every trainer pushes a signed ``RoundCommit``
(``loco/roundcommit.py``: run, epoch, round, base, and the BLAKE3 digest of the payload it will
reveal) to every live member (push kind ``loco_commit``). ``CommitIntake`` keeps one commitment
per member and round, with the time it arrived here (monotonic), checked by ``check_commit``
against the key the trainer's peer id encodes, our run, epoch, round and base; it relays each one
it keeps to the other live members once, so honest trainers' views converge. One validly signed on
another epoch or base (``OtherState``: its trainer forked, restarted or is re-syncing) is refused as
``other_state`` with no strike on its sender: strikes add up to a ban, which would keep an honest
trainer (or the members relaying it) out after it re-synced. Commitments of the
coming ``PARK_ROUNDS`` rounds are held unchecked until their round is current here (their base is
the state we do not hold yet). Of open trainers' commitments at most ``MAX_OPEN`` per round are
held, those the ledger ranks first (``loco/roundrules.open_priority``: earned keys, then newcomers in
the entry draw's order): a better one replaces the worst, so a flood of fresh keys crowds out no
earned trainer, and members sent a flood in different orders still hold the same commitments.

While the swarm runs spot checks (``config.runs_spot_checks``) a commitment must carry an inner
commitment a check can draw on (``check_terms``: a step at least, this model's size, at most
``loco.inner_steps`` steps, our inner-step settings), else no check could ever be drawn on its
trainer. One that does not is refused (``spot_terms``) and not held: its trainer is left out of
the round. No strike: a trainer configured otherwise sends just that, and a member with checks
off relays it.

The agreement (``trainer/agreement.py``) admits a payload only if it matches the commitment its
trainer made, and the round's decision must name every commitment held in time
(``trainer/decisions.py``). Every commitment held (our own too) is served by its digest
(``loco_commit`` fetch, ``<store>/loco/<round>/<digest>.commit``): a member lacking one that a
decision names fetches it (``trainer/commit_fetch.py``) and hands it to ``take_named``, which
checks it as a pushed one is checked and holds it as arrived after every commit phase (``at``
infinite: it was not here in time, so it makes no later decision "omit" it and enters no
decision of ours); the cap on open trainers' commitments does not apply to it (a decision names
at most ``MAX_CONTRIBUTORS``). A second, different commitment of one key for one round is refused
(the first stays); when both are its valid commitments on one chain (same epoch and base,
``commits_conflict``) the pair is equivocation evidence: the peer book convicts the key (a member,
or an open trainer within its share), and the node's evidence plane spreads it like any other.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

from pulse_node.chain.evidence import encode_evidence
from pulse_node.chain.serving import loco_commit_path
from pulse_node.config import TrainerConfig, runs_spot_checks
from pulse_node.daemon.context import RoleContext
from pulse_node.errors import IntegrityError, PulseError
from pulse_node.fsutil import write_atomic
from pulse_node.loco.ledger import Ledger
from pulse_node.loco.roundcommit import (
    MAX_ROUNDCOMMIT_BYTES,
    Expect,
    OtherState,
    RoundCommit,
    check_signed,
    check_terms,
    commit_digest,
    commits_conflict,
    decode_commit,
    encode_commit,
    make_commit,
)
from pulse_node.loco.roundrules import open_priority
from pulse_node.peers.outcomes import Reported
from pulse_node.trainer import own_commits
from pulse_node.trainer.round_peers import RoundPeers
from pulse_node.trainer.rounds import RoundTable
from pulse_node.vocab import LocoRefusal

PARK_ROUNDS = 2  # commitments of coming rounds are held for the next PARK_ROUNDS rounds only
MAX_OPEN = 64  # open trainers' commitments held per round, at most (the ledger's first)


@dataclass(frozen=True)
class HeldCommit:
    """A commitment this trainer holds: its bytes, decoded, and when it arrived here (monotonic;
    infinite for one fetched because a decision named it: never in time)."""

    data: bytes
    commit: RoundCommit
    at: float

    @functools.cached_property
    def digest(self) -> bytes:
        """What a decision names it by (``commit_digest``), hashed once."""
        return commit_digest(self.data)


@dataclass(frozen=True)
class NamedFault:
    """Why a commitment a decision named, fetched by its digest, is not held (``take_named``):
    ``forged`` (no valid commitment of that trainer for this round: its signature, run, epoch,
    round, base or trainer is wrong), ``terms`` (valid, but not on our spot-check terms,
    ``check_terms``), ``second`` (valid, and the trainer's second commitment of the round: the pair
    is evidence against it)."""

    kind: Literal["forged", "terms", "second"]
    message: str


class CommitIntake:
    """One trainer's round commitments (module docstring)."""

    def __init__(self, ctx: RoleContext[TrainerConfig], *, peers: RoundPeers, table: RoundTable,
                 base_of: Callable[[int], bytes | None], ledger: Callable[[], Ledger] = Ledger,
                 shapes: Mapping[str, tuple[int, ...]] | None = None,
                 settings: Callable[[], bytes | None] | None = None) -> None:
        """``base_of(r)``: the base hash round ``r`` starts from here (None: not known yet);
        ``ledger``: the trust ledger of our outer state (which open trainers' commitments come first);
        ``shapes``: the model's, whose size, and ``settings()``: our inner-step settings' digest
        (None: not compared), an inner commitment must name while the swarm runs spot checks."""
        self.ctx, self.peers, self.table, self.base_of, self.ledger = ctx, peers, table, base_of, ledger
        self.params = sum(math.prod(s) for s in (shapes or {}).values())  # 0: no header compared
        self.settings, self.checked = settings or (lambda: None), runs_spot_checks(ctx.cfg)
        self.held: dict[int, dict[str, HeldCommit]] = {}
        self.pending: dict[int, dict[str, tuple[str, bytes, float]]] = {}  # trainer -> (sender, bytes, arrived)

    def make_own(self, r: int, *, base: bytes, payload: bytes, spot: bytes = b"") -> bytes:
        """Sign our commitment of round ``r`` to the payload of digest ``payload``; kept (on disk
        too), returned. One we signed for this round and base before (a restart) is returned
        instead: never two (``trainer/own_commits.py``)."""
        epoch, data_dir = self.table.epoch(), Path(self.ctx.cfg.data_dir)
        data = own_commits.signed_before(data_dir, epoch=epoch, r=r, base=base, signer=self.ctx.identity.public_key_hex)
        if data is None:
            data = encode_commit(make_commit(self.ctx.identity, run_id=self.ctx.cfg.run_id, epoch=epoch, round=r,
                                             base=base, trainer=self.peers.me, payload=payload, spot=spot))
            own_commits.keep(data_dir, epoch=epoch, r=r, data=data)
        self.held.setdefault(r, {})[self.peers.me] = HeldCommit(data, decode_commit(data), time.monotonic())
        self._serve(r, data)
        return data

    def _serve(self, r: int, data: bytes) -> None:
        """Keep a held commitment where the wire worker serves it by digest (``loco_commit``)."""
        try:
            write_atomic(loco_commit_path(Path(self.ctx.store.root), r, commit_digest(data).hex()), data, durable=False)
        except OSError as exc:
            self.ctx.log.warning("cannot serve the round %d commitment: %s", r, exc)

    def take_named(self, r: int, trainer: str, data: bytes, *, coordinator: str) -> NamedFault | None:
        """Take ``trainer``'s commitment of round ``r`` that ``coordinator``'s decision named, fetched
        by the digest it named (checked by the caller): checked like a pushed one (``check_signed``,
        then ``check_terms``), held as never in time and served (module docstring). None if it is
        held now, else why it is not (a second commitment of ``trainer`` is handed to the peer book
        as evidence first, as ``coordinator``'s report)."""
        try:
            c = decode_commit(data)
            if (c.trainer, c.round) != (trainer, r) or len(data) > MAX_ROUNDCOMMIT_BYTES:
                raise IntegrityError(f"it is not {trainer[:12]}'s commitment of round {r}")
            inner = check_signed(c, key=self.peers.key_of(trainer), expect=self._expect(r))
        except PulseError as exc:
            return NamedFault("forged", str(exc))
        have = self.of(r, trainer)
        if have is not None and have.data != data:
            try:
                commits_conflict(have.data, data, self.ctx.cfg.run_id)
            except PulseError as exc:  # unreachable: both were checked against this round
                return NamedFault("forged", str(exc))
            self.ctx.book.judge(coordinator, Reported("two commitments", evidence=encode_evidence("commitment", have.data, data)))
            return NamedFault("second", f"{trainer[:12]} signed two commitments for round {r}")
        try:
            check_terms(c, inner, expect=self._expect(r))
        except PulseError as exc:
            return NamedFault("terms", str(exc))
        if have is None:
            self.held.setdefault(r, {})[trainer] = HeldCommit(data, c, math.inf)
            self._serve(r, data)
            with self.ctx.status.trainer() as counters:
                counters.commits_fetched += 1
        return None

    def of(self, r: int, trainer: str) -> HeldCommit | None:
        return self.held.get(r, {}).get(trainer)

    def round(self, r: int) -> dict[str, HeldCommit]:
        """Every commitment of round ``r`` held here (trainer id -> it)."""
        self.flush()
        return dict(self.held.get(r, {}))

    def offer(self, sender: str, data: bytes) -> str | None:
        """Check and keep a pushed commitment (relayed once); the trainer id whose commitment was
        newly kept, else None. ``PulseError`` if it is refused."""
        if self.peers.dropped("loco", sender):
            return None
        if not self.peers.may_contribute(sender):
            self._refuse(sender, LocoRefusal.NOT_MEMBER, IntegrityError(f"{sender[:12]} is not a trusted trainer-set member"))
        if len(data) > MAX_ROUNDCOMMIT_BYTES:
            self._refuse(sender, LocoRefusal.TOO_LARGE, IntegrityError(f"commitment of {len(data)} bytes"))
        try:
            c = decode_commit(data)
        except PulseError as exc:
            self._refuse(sender, LocoRefusal.BAD_COMMITMENT, exc)
        now, r = time.monotonic(), c.round
        if not self.peers.may_contribute(c.trainer) or not 0 <= r - self.table.current_round() <= PARK_ROUNDS:
            return None  # not a contributor's (relayed junk), or not a round we take commitments for
        if not self.peers.is_member(c.trainer) and not self._room(r, c.trainer):
            return None
        if r > self.table.current_round() or self.base_of(r) is None:
            self.pending.setdefault(r, {}).setdefault(c.trainer, (sender, bytes(data), now))
            return None
        return self._keep(sender, c, bytes(data), now)

    def _room(self, r: int, trainer: str) -> bool:
        """Whether open trainer ``trainer``'s commitment of round ``r`` may be held: one is held
        already (a second is judged by ``_keep``), there is room, or it ranks before the worst
        held (which is dropped for it; module docstring) and the round's commit phase is not over
        here, nor the round decided (a late one never displaces one held in time)."""
        held, pending = self.held.get(r, {}), self.pending.get(r, {})
        opens = [t for t in (*held, *pending) if not self.peers.is_member(t)]
        if trainer in opens or len(opens) < MAX_OPEN:
            return True
        o = self.table.open
        if r in self.table.decisions or (o is not None and o.round == r and time.monotonic() > o.commit_close):
            return False
        ledger = self.ledger()
        worst = max(opens, key=lambda t: open_priority(ledger, t))
        if open_priority(ledger, trainer) > open_priority(ledger, worst):
            return False
        held.pop(worst, None)
        pending.pop(worst, None)
        return True

    def _keep(self, sender: str, c: RoundCommit, data: bytes, at: float) -> str | None:
        have = self.of(c.round, c.trainer)
        if have is not None:
            if have.data != data:
                self._second(sender, c, have.data, data)
            return None
        expect = self._expect(c.round)
        try:
            inner = check_signed(c, key=self.peers.key_of(c.trainer), expect=expect)
        except OtherState as exc:  # its trainer (and a relay) on another state: refused, no strike
            self.peers.refuse(sender, LocoRefusal.OTHER_STATE, str(exc), lied=False)
            raise
        except PulseError as exc:
            self._refuse(sender, LocoRefusal.BAD_COMMITMENT, exc)
        try:
            check_terms(c, inner, expect=expect)
        except PulseError as exc:  # a trainer configured otherwise: not a lie, and not held (module docstring)
            self.peers.refuse(sender, LocoRefusal.SPOT_TERMS, str(exc), lied=False)
            raise
        self.held.setdefault(c.round, {})[c.trainer] = HeldCommit(data, c, at)
        self._serve(c.round, data)
        with self.ctx.status.trainer() as counters:
            counters.commits_held += 1
        to = [*self.peers.live().values(), *self.peers.open_peers(self.held.get(c.round, {}))]
        relay_to = [p for p in to if p.peer_id not in (sender, c.trainer)]
        self.peers.push(relay_to, data, kind="loco_commit", job=f"loco_commit:{c.round}:{c.trainer}")
        if not self.peers.is_member(c.trainer):  # an open trainer learns the members' commitments too
            newcomer = self.peers.open_peers([c.trainer])
            for tid, h in self.held.get(c.round, {}).items():
                if self.peers.is_member(tid):
                    self.peers.push(newcomer, h.data, kind="loco_commit", job=f"loco_commit:{c.round}:{tid}:{c.trainer}")
        return c.trainer

    def _expect(self, r: int) -> Expect:
        """What a commitment of round ``r`` must be here: with spot checks on, one carrying an
        inner commitment of this model's size, at most ``loco.inner_steps`` steps, our settings."""
        base, cfg = self.base_of(r) or b"", self.ctx.cfg
        if not self.checked:
            return Expect(cfg.run_id, self.table.epoch(), r, base)
        return Expect(cfg.run_id, self.table.epoch(), r, base, params=self.params, inner_steps=cfg.loco.inner_steps,
                      settings=self.settings(), spot_required=True)

    def _second(self, sender: str, c: RoundCommit, first: bytes, second: bytes) -> None:
        """A second, different commitment of ``c.trainer`` for ``c.round``: refused; equivocation
        evidence if both are its valid ones on one chain (module docstring)."""
        try:
            commits_conflict(first, second, self.ctx.cfg.run_id)
        except PulseError:  # not its own, or of another chain (a restart, a re-sync): no evidence
            self.peers.refuse(sender, LocoRefusal.DUPLICATE, f"a second commitment of {c.trainer[:12]} "
                              f"for round {c.round}", lied=False)
            return
        self.ctx.book.judge(sender, Reported("two commitments", evidence=encode_evidence("commitment", first, second)))
        self.peers.refuse(sender, LocoRefusal.EQUIVOCATION, f"{c.trainer[:12]} signed two commitments for round "
                          f"{c.round}", lied=False)

    def flush(self) -> list[str]:
        """Check the held commitments of the round now current (its base is known); the trainers
        whose commitments were kept."""
        r, kept = self.table.current_round(), []
        for k in sorted(k for k in self.pending if k <= r):
            if k == r and self.base_of(k) is None:
                continue
            for trainer, (sender, data, at) in self.pending.pop(k).items() if k == r else ():
                try:
                    if (t := self._keep(sender, decode_commit(data), data, at)) is not None:
                        kept.append(t)
                except PulseError as exc:
                    self.ctx.status.error(f"bad round commitment of {trainer[:12]}: {exc}")
        return kept

    def _refuse(self, sender: str, reason: LocoRefusal, exc: PulseError) -> NoReturn:
        self.peers.refuse(sender, reason, str(exc), lied=True)
        raise exc

    def prune(self, r: int) -> None:
        for table in (self.held, self.pending):
            for old in [k for k in table if k < r]:
                del table[old]
