"""Spot-check answers, published: the target's side, and the receipts every member holds.

A drawn target (``trainer/spot_round.py``) publishes its answer once per round (``publish``): it
keeps the encoded answer as ``loco/<round>/<digest>.payload`` under its store root, served by
digest through the fetch kind that serves the round's payloads (``loco_payload``), and pushes
its signed ``AnswerReceipt`` (``loco/spot_answer.py``; push kind ``spot_answer``) to the live
members. A member takes a receipt (``offer``) signed by its target's key for this run and epoch,
of a recent round, pushed by its target or a member; keeps the first per (round, target) with
its arrival time; and relays it once to the live members, like a commitment. Every member then
fetches the answer (``pull``: the receipt's digest and size bound it, and it must decode as the
target's answer of that round), and serves it once held. So whether a target answered is a fact
every member holds (``answered``: the answer held here, not a receipt alone, whose target may
serve no one): an ``unanswered`` verdict of a target whose answer a member holds is refused,
by the verdict intake (a strike on the verifier) and by the decision intake
(``trainer/decisions.py``), and a target that serves nobody fails whoever verifies it.

Only answers that can matter are held, relayed or downloaded (``cap``): of a target the round's
draw picked, once this trainer has drawn the round, else of a key whose commitment of that round
it holds. So receipts of keys nobody checks, one per fresh key, cost a signature check and nothing
more: no relay, no download. ``cap`` also bounds the answer
(``loco/spot_answer.answer_cap`` of the target's commitment held here, at the drawn step once
drawn, each batch at ``BATCH_BYTES``): a receipt signing more is refused before anything is
fetched, a strike on its target (its commitment and its receipt are both its signed word).

A verifier ``fetch``es the answer by digest from its target, else from a live member holding it:
each download is capped by the size the receipt signs and bounded by ``net.fetch_timeout_s`` and
the check's wait; a peer is asked again only ``RETRY_S`` later. Bytes of another digest are the
server's lie; an answer of the signed digest that is not the round's is its target's. Downloads
run in the background (``daemon/background.py``, one job per answer; a lane for our own checks, one
for the pulls): the trainer loop only starts them and reads what is held, so a stalled server never
delays its steps. A try gets at most half the wait left, so a target that stalls its verifier (and
serves the others, who would refute its "no answer") leaves it time to ask the members holding it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import blake3

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.serving import LOCO_DIR, loco_payload_path
from pulse_node.config import TrainerConfig
from pulse_node.daemon.background import Background
from pulse_node.daemon.context import RoleContext
from pulse_node.errors import IntegrityError, PulseError, WireError
from pulse_node.fsutil import write_atomic
from pulse_node.loco.ledger import VERDICT_WINDOW
from pulse_node.loco.spot_answer import (
    MAX_RECEIPT_BYTES,
    RECEIPTS,
    AnswerReceipt,
    SpotAnswer,
    decode_answer,
    encode_answer,
    make_receipt,
)
from pulse_node.net.wire.protocol import PUSH_CAPS, LocoPayloadRequest
from pulse_node.peers.outcomes import Lied
from pulse_node.rl.rollout import MAX_ROLLOUTS
from pulse_node.trainer.round_peers import RoundPeers

MAX_RECEIPTS = 256  # receipts held (the last VERDICT_WINDOW rounds)
RETRY_S = 2.0  # a peer that did not serve an answer is asked again this long after
#: one of a step's rollout batches in an answer: a pushed batch (its push cap) as its trainer
#: re-encoded it (``encode_rollouts``: a float32 reward becomes 8 bytes; wire 2 gains its precision)
BATCH_BYTES = PUSH_CAPS["rollouts"] + 4 * MAX_ROLLOUTS + 64


@dataclass
class Held:
    """A receipt held here: the statement, its bytes, when it arrived (monotonic seconds)."""

    receipt: AnswerReceipt
    data: bytes
    at: float


class Answers:
    """Published answers and their receipts (module docstring)."""

    def __init__(self, ctx: RoleContext[TrainerConfig], *, peers: RoundPeers, current_round: Callable[[], int],
                 epoch: Callable[[], bytes], cap: Callable[[int, str], int | None]) -> None:
        """``cap(r, target)``: the most bytes ``target``'s answer of round ``r`` may take (None: it
        cannot matter here)."""
        self.ctx, self.peers, self.me = ctx, peers, peers.me
        self.current_round, self.epoch, self.cap = current_round, epoch, cap
        self.root = Path(ctx.store.root)
        self.held: dict[tuple[int, str], Held] = {}  # receipts
        self.have: dict[tuple[int, str], float] = {}  # answers held here (valid, of their receipt's digest): since when
        self.tried: dict[tuple[int, str], dict[str, float]] = {}  # per answer, peer -> when last asked
        self._lock = threading.Lock()  # ``have`` and ``tried``: the downloads write them too
        self._lanes: dict[str, Background] = {}  # "check": our own checks' downloads, "pull": the others

    def publish(self, answer: SpotAnswer) -> None:
        """Keep and serve our ``answer``; push its signed receipt to the live members (``WireError``
        if it is past the bound the others hold it to)."""
        data = encode_answer(answer)
        cap = self.cap(answer.round, self.me)
        if cap is None or len(data) > cap:
            raise WireError(f"our answer of {len(data)} bytes is past its bound ({cap} bytes)")
        rc = make_receipt(self.ctx.identity, run_id=self.ctx.cfg.run_id, epoch=self.epoch(), answer=answer, data=data)
        write_atomic(loco_payload_path(self.root, answer.round, rc.digest.hex()), data, durable=False)
        encoded = RECEIPTS.encode(rc)
        key, now = (answer.round, self.me), time.monotonic()
        self.held[key], self.have[key] = Held(rc, encoded, now), now
        self.ctx.push_in_background("spot_answer", encoded, list(self.peers.live().values()),
                                    job=f"spot_answer:{answer.round}")

    def offer(self, sender: str, data: bytes) -> None:
        """A pushed receipt (module docstring); ``PulseError`` if refused."""
        if len(data) > MAX_RECEIPT_BYTES:
            raise WireError(f"a spot answer receipt of {len(data)} bytes")
        rc = RECEIPTS.decode(data)
        if not (sender == rc.target and self.peers.may_contribute(sender)) and not self.peers.is_member(sender):
            raise IntegrityError(f"answer receipt of {rc.target[:12]} pushed by {sender[:12]}, neither it nor a member")
        if rc.run_id != self.ctx.cfg.run_id or rc.epoch != self.epoch() or \
                not -1 <= self.current_round() - rc.round <= VERDICT_WINDOW:
            return  # another run's, chain's or an old round's: nothing to hold
        RECEIPTS.verify(rc, signer_key=self.peers.key_of(rc.target), tag=f"answer receipt of {rc.target[:12]}")
        key = (rc.round, rc.target)
        if key in self.held or not self._fits(rc):
            return
        self._prune()
        self.held[key] = Held(rc, bytes(data), time.monotonic())
        if self.peers.i_am_member():
            to = [p for pid, p in self.peers.live().items() if pid not in (sender, rc.target)]
            self.ctx.push_in_background("spot_answer", bytes(data), to, job=f"spot_answer:{rc.round}:{rc.target}")

    def answered(self, r: int, target: str) -> float | None:
        """Since when ``target``'s answer of round ``r`` (valid, of the digest its receipt signs) is
        held here (None: not held; a receipt alone proves nothing: its target may serve no one)."""
        return self.have.get((r, target))

    def pull(self, *, wait_s: float) -> None:
        """A member holds every published answer it can (so it serves it, and refutes a "no
        answer" of it): a download (one peer) started for each receipt younger than ``wait_s``."""
        now = time.monotonic()
        for (r, target), h in sorted(self.held.items(), key=lambda kv: kv[1].at):
            if (r, target) not in self.have and now < h.at + wait_s and self._due(r, target, now) and \
                    self._may_fetch(h.receipt):
                self._start(r, target, h, until=h.at + wait_s, tries=1, lane="pull")

    def fetch(self, r: int, target: str, *, until: float, tries: int = 64) -> SpotAnswer | None:
        """``target``'s published answer of round ``r`` if held here (None: no receipt, or not held
        yet: its download is started, up to ``tries`` peers until ``until``, in the background)."""
        h = self.held.get((r, target))
        if h is None:
            return None
        path = loco_payload_path(self.root, r, h.receipt.digest.hex())
        if (r, target) in self.have:
            return self._answer(path.read_bytes(), h.receipt) if path.exists() else None
        if self._may_fetch(h.receipt):
            self._start(r, target, h, until=until, tries=tries, lane="check")
        return None

    def _start(self, r: int, target: str, h: Held, *, until: float, tries: int, lane: str) -> None:
        """Download ``target``'s answer of round ``r`` in the background, unless that is under way:
        from the target, else a live member; a peer is asked again only ``RETRY_S`` after it was
        last asked; at most ``tries`` peers, until ``until``."""
        downloads = self._lanes.get(lane) or self._lanes.setdefault(lane, Background(f"spot-answers-{lane}"))
        job = f"spot_answer:{r}:{target}"
        if downloads.waiting_or_running(job):
            return
        own = [p for p in self.ctx.peers() if p.peer_id == target]
        peers = [*own, *sorted(self.peers.live().values(), key=lambda p: p.peer_id.encode())]
        downloads.submit(job, lambda: self._download_any(r, target, h, peers, until=until, tries=tries))

    def _download_any(self, r: int, target: str, h: Held, peers: list[PeerRecord], *, until: float,
                      tries: int) -> None:
        """``_start``'s job (on the download thread)."""
        for peer in peers:
            now = time.monotonic()
            with self._lock:
                asked = self.tried.setdefault((r, target), {})
                if tries <= 0 or now >= until or now < asked.get(peer.peer_id, -RETRY_S) + RETRY_S:
                    continue
                tries, asked[peer.peer_id] = tries - 1, now
            data = self._download(peer, h.receipt, timeout=max(0.5, min(self.ctx.cfg.net.fetch_timeout_s, (until - now) / 2)))
            if data is not None and self._answer(data, h.receipt) is not None:
                write_atomic(loco_payload_path(self.root, r, h.receipt.digest.hex()), data, durable=False)
                with self._lock:  # served from here on
                    self.have[r, target] = time.monotonic()
                return

    def _fits(self, rc: AnswerReceipt) -> bool:
        """Whether ``rc``'s answer can matter here; ``IntegrityError`` (a strike on its target) if
        it signs a size past the bound of its target's commitment (as held here, at the drawn step)."""
        cap = self.cap(rc.round, rc.target)
        if cap is None:
            return False
        if rc.size > cap:
            self.held.pop((rc.round, rc.target), None)
            self.peers.book.judge(rc.target, Lied(f"a spot answer receipt of {rc.size} bytes, past its bound {cap}"))
            raise IntegrityError(f"the answer receipt of {rc.target[:12]} of round {rc.round} signs {rc.size} bytes; "
                                 f"its commitment bounds the answer to {cap}")
        return True

    def _may_fetch(self, rc: AnswerReceipt) -> bool:
        """``_fits`` once more (the round may have been drawn since ``rc`` came), False if refused."""
        try:
            return self._fits(rc)
        except PulseError as exc:
            self.ctx.status.error(str(exc))
            return False

    def _due(self, r: int, target: str, now: float) -> bool:
        with self._lock:
            asked = self.tried.get((r, target), {})
            return not asked or min(asked.values()) + RETRY_S <= now

    def _download(self, peer: PeerRecord, rc: AnswerReceipt, *, timeout: float) -> bytes | None:
        dest = self.root / LOCO_DIR / f".fetch-spot-answer-{threading.current_thread().name}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.ctx.transport.fetch(peer, LocoPayloadRequest(round=rc.round, digest=rc.digest.hex()), dest,
                                     timeout=timeout, max_bytes=rc.size)
            data = dest.read_bytes()
        except (PulseError, OSError) as exc:
            self.ctx.log.debug("spot answer of %s from %s: %s", rc.target[:12], peer.peer_id[:12], exc)
            return None
        finally:
            dest.unlink(missing_ok=True)
        if len(data) > rc.size or blake3.blake3(data).digest() != rc.digest:
            self.peers.book.judge(peer.peer_id, Lied(f"served other bytes than the spot answer of {rc.target[:12]}"))
            return None
        return data

    def _answer(self, data: bytes, rc: AnswerReceipt) -> SpotAnswer | None:
        try:
            a = decode_answer(data)
            if (a.round, a.target) != (rc.round, rc.target):
                raise WireError(f"the answer is of round {a.round} of {a.target[:12]}")
        except PulseError as exc:  # the bytes its target signed: its lie
            self.ctx.status.error(f"round {rc.round}: the published spot answer of {rc.target[:12]} is bad: {exc}")
            if rc.target != self.me:
                self.peers.book.judge(rc.target, Lied(f"a bad spot answer: {exc}"))
            return None
        return a

    def _prune(self) -> None:
        old = self.current_round() - VERDICT_WINDOW
        self.held = {k: h for k, h in self.held.items() if k[0] >= old and (k[1] == self.me or self.cap(*k) is not None)}
        while len(self.held) >= MAX_RECEIPTS:
            self.held.pop(min(self.held, key=lambda k: k[0]))
        with self._lock:
            self.have = {k: t for k, t in self.have.items() if k in self.held}
            self.tried = {k: t for k, t in self.tried.items() if k in self.held}

    def close(self) -> None:
        """Stop the downloads (waits a moment for the one running)."""
        for lane in self._lanes.values():
            lane.close(timeout=1.0)
