"""The round agreement's dealings with peers: who takes part, small fetches, refusals.

Who is a trainer-set member, which members are live and whom to ignore is the peer book's
(``peers/book.py``); the agreement (``trainer/agreement.py``) asks it through this object, never
discovery directly:

- ``live()``: the member trainers in discovery (not us). Only they are pushed to, counted in a
  round's coordinator order and "all in", asked for decisions and fetched payloads from; a peer
  that merely announces the trainer role is none of these (nor asked for a round commitment a
  decision names and we lack, ``trainer/decisions.py``).
- ``is_member(peer_id)``: by the key the peer id encodes (libp2p Ed25519 ids; on the in-memory
  test hub, the key its record announces): configured keys, the key file, admissions; in an open
  swarm every peer announcing the trainer role. A member stays one for the agreement after it
  leaves discovery (the book remembers its key), so a decision naming a trainer that just died is
  still valid; a key convicted of equivocation is none from then on.
- ``push(...)``: payloads and decisions go out through the node's one background pusher
  (``RoleContext.push_in_background``: all live members at once, each push bounded, a round never
  waits on a slow or vanished peer); a failed push is reported in the status.
- ``refuse(...)``: count a refused payload or decision by reason (``loco_refused`` /
  ``decisions_refused`` in the status) and, when the refusal means the sender lied, hand the
  book a ``Lied`` (3 strikes ban it; a banned peer's payloads are dropped, reason ``banned``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.serving import LOCO_DIR
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status_model import count
from pulse_node.errors import PulseError, WireError
from pulse_node.net.wire.protocol import LocoCommitRequest, LocoDecisionRequest, LocoPayloadRequest, kind_of
from pulse_node.peers.outcomes import Lied
from pulse_node.vocab import DecisionRefusal, LocoRefusal

What = Literal["loco", "decision"]
#: a decision push's bound (a payload push is bounded by ``loco.deadline_s``)
PUSH_TIMEOUT_S = 5.0


class RoundPeers:
    """Membership, small fetches and refusals of one trainer's contributor agreement."""

    def __init__(self, ctx: RoleContext[TrainerConfig]) -> None:
        self.ctx, self.book = ctx, ctx.book
        self.me = ctx.transport.peer_id
        self._logged: set[tuple[str, str]] = set()

    def live(self) -> dict[str, PeerRecord]:
        """Live trainer-set members but us (``PeerBook.live_trainers``)."""
        return self.book.live_trainers(self.ctx.peers())

    def key_of(self, peer_id: str) -> str:
        """The key ``peer_id`` speaks for ("" if unknown)."""
        return self.ctx.identity.public_key_hex if peer_id == self.me else self.book.key_of(peer_id)

    def is_member(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is a trainer-set member (discovery is re-read once if not)."""
        if peer_id == self.me:
            return self.i_am_member()
        return self.book.member_peer(peer_id) or (
            self.live() is not None and self.book.member_peer(peer_id))

    def i_am_member(self) -> bool:
        """Whether our own key is a trainer-set member (an open trainer is none: it never decides);
        an admitted trainer's own admission is learned here first (no peer need show it its record)."""
        return self.book.own_depth(self.ctx.identity.public_key_hex, self.ctx.admission) is not None

    def open_trainer(self, peer_id: str) -> bool:
        """``chain.open_trainers``: a non-member whose key is known here and not convicted."""
        if not self.ctx.cfg.chain.open_trainers or self.is_member(peer_id):
            return False
        key = self.key_of(peer_id)
        return bool(key) and not self.book.convicted(key)

    def open_peers(self, ids: Iterable[str]) -> list[PeerRecord]:
        """The discovered records of the open trainers among ``ids`` (those that committed to a
        round here: they are sent its commitments, so they reveal as soon as members do)."""
        wanted = {i for i in ids if self.open_trainer(i)}
        return [p for p in self.ctx.peers() if p.peer_id in wanted] if wanted else []

    def live_open(self, version: int) -> list[str]:
        """The open trainers in discovery (``open_trainer``) that announce ``version`` or later (they
        hold a round's base): a round's commit phase waits a little for them (``trainer/pace.py``)."""
        if not self.ctx.cfg.chain.open_trainers:
            return []
        return [p.peer_id for p in self.ctx.peers("trainer") if p.head >= version and self.open_trainer(p.peer_id)]

    def may_contribute(self, peer_id: str) -> bool:
        """A member, or an open trainer (``open_trainer``): its commitments and payloads are taken."""
        return self.is_member(peer_id) or self.open_trainer(peer_id)

    def fetch(self, peer: PeerRecord, request: LocoPayloadRequest | LocoDecisionRequest | LocoCommitRequest, *,
              cap: int, timeout: float) -> bytes | None:
        """Bytes of a small fetch (``loco_payload``, ``loco_decision``, ``loco_commit``) from a member, at most
        ``cap`` (the download itself is capped), or None on any failure or a non-member (a peer
        that has no decision yet is no failure: nothing is judged here)."""
        if not self.is_member(peer.peer_id):
            return None
        kind = kind_of(request)
        dest = Path(self.ctx.store.root) / LOCO_DIR / f".fetch-{kind}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.ctx.transport.fetch(peer, request, dest, timeout=timeout, max_bytes=cap)
            if dest.stat().st_size > cap:
                raise WireError(f"{kind} from {peer.peer_id[:12]} exceeds {cap} bytes")
            return dest.read_bytes()
        except (PulseError, OSError) as exc:
            self.ctx.log.debug("%s from %s: %s", request, peer.peer_id[:12], exc)
            return None
        finally:
            dest.unlink(missing_ok=True)

    def push(self, peers: list[PeerRecord], data: bytes, *, kind: Literal["loco", "loco_commit", "loco_decision"], job: str,
             timeout: float = PUSH_TIMEOUT_S) -> None:
        """Push to every peer at once, in the background (each bounded by ``timeout``); a newer job
        of the same name replaces one not started yet."""
        if not peers:
            return

        def failed(peer: PeerRecord, exc: PulseError) -> None:
            self.ctx.status.error(f"{kind} push to {peer.peer_id[:12]} failed: {exc}")

        self.ctx.push_in_background(kind, data, peers, job=job, timeout=timeout, newcomers=len(peers), on_error=failed)

    def banned(self, peer_id: str) -> bool:
        return peer_id != self.me and self.book.ignored(peer_id)

    def dropped(self, what: What, peer_id: str) -> bool:
        """A banned peer never seen as a member: drop its input unread (counted, not logged)."""
        if self.book.remembered(peer_id) or not self.banned(peer_id):
            return False
        with self.ctx.status.trainer() as c:
            if what == "loco":
                count(c.loco_refused, LocoRefusal.BANNED)
            else:
                count(c.decisions_refused, DecisionRefusal.BANNED)
        return True

    def refuse(self, sender: str, reason: LocoRefusal | DecisionRefusal, message: str, *, lied: bool) -> None:
        """Count a refusal of a payload (a ``LocoRefusal``) or a decision (a ``DecisionRefusal``) by
        reason; ``lied``: the sender lied (the book judges it); logged once per sender and reason."""
        what = "loco" if isinstance(reason, LocoRefusal) else "decision"
        with self.ctx.status.trainer() as c:
            if isinstance(reason, LocoRefusal):
                count(c.loco_refused, reason)
            else:
                count(c.decisions_refused, reason)
                c.decisions_rejected += 1
        if lied and sender != self.me:
            self.book.judge(sender, Lied(f"{what} refused ({reason}): {message}"))
        if (sender, reason) not in self._logged and len(self._logged) < 4096:
            self._logged.add((sender, reason))
            self.ctx.log.warning("refused %s from %s (%s): %s", what, sender[:12], reason, message)
