"""Who takes part in a PULSELoCo round: trainer-set members only (``chain/trainerset.py``).

The contributor agreement (``trainer/agreement.py``) asks this object, never discovery directly:

- ``live()``: the member trainers in discovery (not us). Only they are pushed to, counted in a
  round's coordinator order and "all in", asked for decisions and fetched payloads from; a peer
  that merely announces the trainer role is none of these.
- ``is_member(peer_id)``: by the key the peer id encodes (libp2p Ed25519 ids; on the in-memory
  test hub, the key its record announces), against the same ``TrustPolicy`` / ``TrainerSet``
  the rest of the node uses: configured keys, the key file, admissions. In an open swarm (no key
  configured) every peer announcing the trainer role is a member, as for version records. A
  member stays one for the agreement after it leaves discovery (its key is remembered, at most
  ``KNOWN_CAP`` of them), so a decision naming a trainer that just died is still valid.
- ``refuse(...)``: count a refused payload or decision by reason (``loco_refused`` /
  ``decisions_refused`` in the status) and strike the sender through the trust policy's strike
  mechanism (3 strikes ban it; a banned peer's payloads are dropped, reason ``banned``).
- A key convicted of equivocation (``chain/evidence.py``) is no member here from then on, even
  while it is still in discovery or remembered: it is not live, pushed to, waited for or fetched from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.serving import LOCO_DIR
from pulse_node.chain.trainerset import sender_key
from pulse_node.chain.trust import TrustPolicy
from pulse_node.config import TrainerConfig
from pulse_node.daemon.context import RoleContext
from pulse_node.daemon.status_model import count
from pulse_node.errors import PulseError, WireError
from pulse_node.net.wire.protocol import LocoDecisionRequest, LocoPayloadRequest, kind_of
from pulse_node.vocab import DecisionRefusal, LocoRefusal

What = Literal["loco", "decision"]
KNOWN_CAP = 4096  # member peer ids whose key is remembered after they leave discovery


class RoundTrust:
    """Membership and refusals of one trainer's contributor agreement."""

    def __init__(self, ctx: RoleContext[TrainerConfig], trust: TrustPolicy) -> None:
        self.ctx, self.trust = ctx, trust
        self.me = ctx.transport.peer_id
        self._peers: list[PeerRecord] = []
        self._logged: set[tuple[str, str]] = set()
        self._known: dict[str, str] = {}  # member peer id -> its key, as seen in discovery

    def live(self) -> dict[str, PeerRecord]:
        """Live trainer-set members but us (learning admissions from discovery first)."""
        self._peers = self.ctx.peers()
        self.trust.observe(self._peers)
        live = {p.peer_id: p for p in self._peers if p.role == "trainer" and self.trust.vouches_for(p)}
        for pid in live:
            if pid not in self._known and len(self._known) < KNOWN_CAP:
                self._known[pid] = sender_key(pid, self._peers)
        return live

    def key_of(self, peer_id: str) -> str:
        """The key ``peer_id`` speaks for ("" if unknown)."""
        if peer_id == self.me:
            return self.ctx.identity.public_key_hex
        return sender_key(peer_id, self._peers) or self._known.get(peer_id, "")

    def is_member(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is a trainer-set member (discovery is re-read once if not)."""
        return peer_id == self.me or self._member(peer_id) or (self.live() is not None and self._member(peer_id))

    def _member(self, peer_id: str) -> bool:
        known = self._known.get(peer_id)
        if known is not None and known in self.trust.evidence:
            return False  # convicted of equivocation: out of the effective trainer set for good
        if known is not None and (self.trust.trainers.open or self.trust.trainers.is_member(known)):
            return True
        return self.trust.is_member(self.key_of(peer_id))

    def fetch(self, peer: PeerRecord, request: LocoPayloadRequest | LocoDecisionRequest, *, cap: int,
              timeout: float) -> bytes | None:
        """Bytes of a small fetch (``loco_payload``, ``loco_decision``) from a member, at most
        ``cap`` (the download itself is capped), or None on any failure or a non-member."""
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

    def banned(self, peer_id: str) -> bool:
        return peer_id != self.me and (self.trust.ignored(peer_id) or self.key_of(peer_id) in self.trust.evidence)

    def dropped(self, what: What, peer_id: str) -> bool:
        """A banned peer never seen as a member: drop its input unread (counted, not logged)."""
        if peer_id in self._known or not self.banned(peer_id):
            return False
        with self.ctx.status.trainer() as c:
            if what == "loco":
                count(c.loco_refused, LocoRefusal.BANNED)
            else:
                count(c.decisions_refused, DecisionRefusal.BANNED)
        return True

    def refuse(self, sender: str, reason: LocoRefusal | DecisionRefusal, message: str, *, strike: bool) -> None:
        """Count a refusal of a payload (a ``LocoRefusal``) or a decision (a ``DecisionRefusal``) by
        reason, strike ``sender`` if asked; logged once per sender and reason."""
        what = "loco" if isinstance(reason, LocoRefusal) else "decision"
        with self.ctx.status.trainer() as c:
            if isinstance(reason, LocoRefusal):
                count(c.loco_refused, reason)
            else:
                count(c.decisions_refused, reason)
                c.decisions_rejected += 1
        if strike and sender != self.me:
            self.trust.strike(sender)
        if (sender, reason) not in self._logged and len(self._logged) < 4096:
            self._logged.add((sender, reason))
            self.ctx.log.warning("refused %s from %s (%s): %s", what, sender[:12], reason, message)
