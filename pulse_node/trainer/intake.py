"""Fair intake of rollout batches: one queue per sender, served round robin, capped, tallied.

Inference nodes push rollout batches to a trainer; the sender of each is the peer id the
transport authenticated. ``RolloutIntake`` keeps the raw bytes (decoded and verified only when
the trainer takes a batch, so a batch that goes stale in the queue costs nothing) in one FIFO per
sender and hands them out round robin, so a sender that floods gets one turn per round of
senders like everyone else. Caps: ``verify.max_queued_batches`` and ``verify.max_queued_bytes``
per sender (the sender's oldest batch goes first: it is the stalest) and
``verify.max_total_bytes`` over all (the largest queue loses its oldest batch). Every refusal
is tallied per sender by reason; refusals that mean the sender lied are its ``Lied`` in the peer
book (``peers/strikes.py``: every 3 strikes ban it for 60 s, doubling per further ban up to
1 h), and a banned sender's
batches are refused on arrival, and those it had queued before the ban are dropped unverified
when their turn comes (a ban must not still cost a forward per queued batch).

Keys are free, so turns are not one per key: senders with standing (``peers/standing.py``: a batch
of theirs was accepted before) take their turns round robin, and senders without standing share
one turn in every ``NEWCOMER_EVERY`` together, so 1 or 1,000 fresh keys cost the trainer the same
verification work while honest batches wait. Each sender's tally is the status model's
``SenderReport``; ``tallies()`` copies them for the node status.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial

from pulse_node.codec.state import State
from pulse_node.daemon.status import NodeStatus
from pulse_node.daemon.status_model import SenderReport, count
from pulse_node.errors import WireError
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Accepted, Lied, Unexpected
from pulse_node.rl.config import VerifyConfig
from pulse_node.rl.rollout import Rollout, decode_rollouts
from pulse_node.rl.verify import BatchVerdict, RolloutCheck, RolloutVerifier
from pulse_node.vocab import BatchRefusal

#: senders whose tallies are kept (the least recently seen idle sender is forgotten first)
MAX_TRACKED_SENDERS = 1024
#: while senders with standing have batches queued, one take in this many goes to a newcomer
NEWCOMER_EVERY = 4


class RolloutIntake:
    """Per-sender FIFOs of raw rollout batches, served round robin."""

    def __init__(self, cfg: VerifyConfig, *, book: PeerBook) -> None:
        self.cfg = cfg
        self.book = book  # the node's: a sender banned for lying about rollouts is banned everywhere
        self._known_in_a_row = 0
        self._queues: dict[str, deque[bytes]] = {}
        self._turns: deque[str] = deque()  # senders with queued batches, next turn first
        self._tally: dict[str, SenderReport] = {}
        self.total_bytes = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def tally(self, sender: str) -> SenderReport:
        t = self._tally.get(sender)
        if t is None:
            self._forget_idle()
            t = self._tally[sender] = SenderReport()
        t.last_seen = time.time()
        return t

    def offer(self, sender: str, data: bytes) -> bool:
        """Queue a batch from ``sender``; False (tallied) if refused on arrival."""
        if self.book.ignored(sender):
            self.refused(sender, BatchRefusal.BANNED, strike=False)
            return False
        if len(data) > self.cfg.max_queued_bytes:
            self.refused(sender, BatchRefusal.TOO_LARGE, strike=False)
            return False
        item = bytes(data)
        queue = self._queues.setdefault(sender, deque())
        if sender not in self._turns:
            self._turns.append(sender)
        queue.append(item)
        self._account(sender, +1, len(item))
        while len(queue) > self.cfg.max_queued_batches or self.tally(sender).queued_bytes > self.cfg.max_queued_bytes:
            self._drop_oldest(sender)
        while self.total_bytes > self.cfg.max_total_bytes:
            self._drop_oldest(max(self._queues, key=lambda s: self._tally[s].queued_bytes))
        kept = self._queues.get(sender)
        return kept is not None and len(kept) > 0 and kept[-1] is item

    def take(self) -> tuple[str, bytes] | None:
        """The next batch (None when every queue is empty): senders with standing round robin,
        newcomers one turn in ``NEWCOMER_EVERY`` together; a banned sender's queue is dropped."""
        while self._turns:
            sender = self._next_turn()
            queue = self._queues.get(sender)
            if not queue:
                continue
            if self.book.ignored(sender):  # banned after these were queued: never verified
                while queue:
                    self._drop_oldest(sender, reason=BatchRefusal.BANNED)
                continue
            data = queue.popleft()
            self._account(sender, -1, -len(data))
            if queue:
                self._turns.append(sender)
            else:
                del self._queues[sender]
            return sender, data
        return None

    def _next_turn(self) -> str:
        """Pop the sender whose turn it is."""
        known = next((s for s in self._turns if self.book.known(s)), None)
        newcomer = next((s for s in self._turns if not self.book.known(s)), None)
        if known is not None and (newcomer is None or self._known_in_a_row < NEWCOMER_EVERY - 1):
            self._known_in_a_row += 1
            pick = known
        else:
            self._known_in_a_row = 0
            pick = newcomer if newcomer is not None else self._turns[0]
        self._turns.remove(pick)
        return pick

    def accepted(self, sender: str, rollouts: int) -> None:
        self.book.judge(sender, Accepted(rollouts))
        t = self.tally(sender)
        t.accepted += 1
        t.accepted_rollouts += rollouts

    def refused(self, sender: str, reason: BatchRefusal, *, strike: bool) -> None:
        """Tally a refused batch; ``strike`` when the refusal means the sender lied."""
        t = self.tally(sender)
        count(t.rejected, reason)
        if strike:
            self.book.judge(sender, Lied(f"rollout batch refused: {reason}"))
            t.strikes = self.book.strikes[sender]

    def tallies(self) -> dict[str, SenderReport]:
        """A copy of every sender's tally (for status.json)."""
        out = {}
        for sender, t in self._tally.items():
            t.banned = self.book.ignored(sender)
            out[sender] = t.model_copy(deep=True)
        return out

    def _account(self, sender: str, batches: int, nbytes: int) -> None:
        t = self.tally(sender)
        t.queued += batches
        t.queued_bytes += nbytes
        self.total_bytes += nbytes

    def _drop_oldest(self, sender: str, *, reason: BatchRefusal = BatchRefusal.QUEUE_FULL) -> None:
        queue = self._queues[sender]
        data = queue.popleft()
        self._account(sender, -1, -len(data))
        self.refused(sender, reason, strike=False)
        if not queue:
            del self._queues[sender]

    def _forget_idle(self) -> None:
        if len(self._tally) < MAX_TRACKED_SENDERS:
            return
        idle = [s for s in self._tally if s not in self._queues]
        if idle:
            del self._tally[min(idle, key=lambda s: self._tally[s].last_seen)]


class RolloutFeed:
    """The trainer's source of checked peer batches: intake queues -> decode -> verify -> tally.

    Holds the BF16 states of the versions a batch may still be made from (the newest
    ``max_staleness + 1``: ``keep_state`` on every publication, ``forget_states`` on a re-sync,
    whose earlier states were another fork's). A refused batch is tallied and the next one is
    taken at once: it never uses up an inner step.
    """

    def __init__(self, verifier: RolloutVerifier, cfg: VerifyConfig, *, status: NodeStatus,
                 book: PeerBook) -> None:
        self.verifier, self.status = verifier, status
        self.intake = RolloutIntake(cfg, book=book)
        self.states: dict[int, State] = {}
        self.sender = ""  # who made the batch ``next_batch`` returned last

    def keep_state(self, version: int, state: State) -> None:
        self.states[version] = state
        low = version - self.verifier.max_staleness
        self.states = {v: s for v, s in self.states.items() if v >= low}

    def forget_states(self) -> None:
        self.states.clear()

    def offer(self, sender: str, data: bytes) -> None:
        self.intake.offer(sender, data)
        self.status.update(rollout_senders=self.intake.tallies())

    def next_batch(self, current_version: int) -> list[Rollout] | None:
        """The next accepted batch (trainer-scored rollouts), or None once the queues are empty."""
        while (item := self.intake.take()) is not None:
            sender, data = item
            # where the trainer takes a peer's batch: an unexpected exception refuses it (sender struck)
            verdict = self.intake.book.contain(sender, partial(self._check, sender, data, current_version),
                                               what="rollout batch")
            if isinstance(verdict, Unexpected):
                self.status.error(f"rollout batch from {sender[:12]} refused: {verdict.why}")
                continue
            with self.status.trainer() as c:
                c.rollouts_in += len(verdict.checks)
                if not verdict.ok:
                    c.rollouts_refused += len(verdict.checks)
            if verdict.ok:
                self.intake.accepted(sender, len(verdict.rollouts))
            elif verdict.reason:
                self.intake.refused(sender, verdict.reason, strike=verdict.strike)
                if verdict.strike:
                    with self.status.node() as n:
                        n.rejected += 1
                    self.status.error(f"rollout batch from {sender[:12]} refused: {verdict.reason} ({verdict.detail})")
            self.status.update(rollout_senders=self.intake.tallies())
            if verdict.ok:
                self.sender = sender
                return verdict.rollouts
        return None

    def _check(self, sender: str, data: bytes, current_version: int) -> BatchVerdict:
        try:
            rollouts = decode_rollouts(data)
        except WireError as exc:
            return BatchVerdict(BatchRefusal.MALFORMED, str(exc), [RolloutCheck(0, BatchRefusal.MALFORMED, str(exc))])
        return self.verifier.check(rollouts, sender=sender, current_version=current_version,
                                   state_of=self.states.get)
