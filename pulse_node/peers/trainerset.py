"""The trainer set: the Ed25519 keys that may train, sign versions, decide rounds, serve trainer state.

This is the one place the swarm's trust model lives (``docs/ARCHITECTURE.md``, "Trust model");
the peer book (``peers/book.py``) owns the node's one set.

- **Keyed** (whenever any key is configured): the members are the configured keys, the **roots**
  (``chain.trusted_trainers`` and the keys in the file or directory ``chain.trusted_trainers_path``),
  plus every key admitted by an ``Admission`` (``chain/admission.py``) that ``quorum`` members
  endorsed. Nothing a peer announces adds a member; an admission is verified against the members
  this node already trusts: run id, each signature, quorum, and **who may endorse**: a member
  within ``depth`` of the roots (``chain.admission_depth``; 1, the default: roots only; a key
  admitted by roots is at depth 1, one admitted by depth-1 members at 2), never a convicted key
  (``convicted``: the evidence book). A member's depth is one more than the deepest of the
  ``quorum`` shallowest endorsers that admitted it. A conviction re-checks every admission
  (``mark_revised``): one that no longer has ``quorum`` unconvicted endorsers within depth is revoked,
  and whatever it endorsed with it. Admissions may chain within the depth, so ``mark_observed``
  repeats until nothing changes. Removing a root is a config change (and a restart) on every node.
- **Open** (no key configured): any peer that announces the trainer role is a member, under the
  key its peer id encodes. Anyone can then train, sign versions and steer the model. Only for a
  local swarm: ``pulse-node join`` refuses it on a non-loopback bootstrap unless the operator
  sets ``chain.open_swarm`` (``--open-swarm``), and the node then prints a warning banner and
  reports ``trust_mode = "open"`` in its status.

``bound_key(peer)`` is the only way a peer's key is read: the key its peer id encodes (libp2p
Ed25519 ids embed it), never a key the peer merely announces; a peer announcing another key gets
none. (Ids that are not libp2p ids exist only on the in-memory test hub, where the hub, not the
peer, sets the id; there the announced key is used.)
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable

from pulse_node.chain.admission import Admission, TrainerSetSettings, check_key, read_key_file
from pulse_node.chain.identity import key_id_of, key_of_peer_id
from pulse_node.chain.peer import PeerRecord
from pulse_node.errors import IntegrityError, WireError

log = logging.getLogger("pulse.trust")

#: members a set holds at most (configured + admitted)
MAX_MEMBERS = 256
_REJECTED_CAP = 1024


def bound_key(peer: PeerRecord) -> str:
    """The Ed25519 key (hex) a peer speaks for: the one its peer id encodes ("" if it announces
    another). Non-libp2p ids (the in-memory test hub only): the key it announces."""
    announced = (peer.node_key or "").lower()
    try:
        key = key_of_peer_id(peer.peer_id)
    except WireError:
        return announced
    return key if announced in ("", key) else ""


def sender_key(sender: str, peers: Iterable[PeerRecord]) -> str:
    """The key of an authenticated sender (a push's peer id): encoded in its id, else (test hub)
    the key its discovery record announces."""
    try:
        return key_of_peer_id(sender)
    except WireError:
        return next((bound_key(p) for p in peers if p.peer_id == sender), "")



class TrainerSet:
    """Members of one run's trainer set (see the module docstring); ``observe`` learns from peers."""

    def __init__(self, *, run_id: str, keys: Iterable[str] = (), quorum: int = 0, depth: int = 1,
                 convicted: Callable[[str], bool] = lambda key: False) -> None:
        self.run_id = run_id
        self.configured = frozenset(check_key(k) for k in keys)
        self.admitted: dict[str, Admission] = {}
        self.depths: dict[str, int] = {}  # admitted key -> its depth (roots are at 0)
        self.open = not self.configured
        self.quorum = quorum or len(self.configured) // 2 + 1
        self.depth = depth
        self.convicted = convicted  # the evidence book: a convicted key endorses nothing
        self._endorsers: dict[str, frozenset[str]] = {}  # admitted key -> members whose endorsement verified
        self._announced: frozenset[str] = frozenset()
        self._rejected: OrderedDict[bytes, int] = OrderedDict()  # admission digest -> set size then

    @classmethod
    def from_config(cls, chain: TrainerSetSettings, *, run_id: str) -> TrainerSet:
        """The set a node's ``[chain]`` config describes (reads ``trusted_trainers_path``)."""
        keys = list(chain.trusted_trainers)
        if chain.trusted_trainers_path is not None:
            keys += read_key_file(chain.trusted_trainers_path)
        return cls(run_id=run_id, keys=keys, quorum=chain.admission_quorum, depth=chain.admission_depth)

    @property
    def members(self) -> frozenset[str]:
        return self._announced if self.open else self.configured | frozenset(self.admitted)

    def is_member(self, key: str) -> bool:
        return bool(key) and key.lower() in self.members

    def depth_of(self, key: str) -> int | None:
        """0 for a root (and any member of an open set), an admitted member's depth, None for a non-member."""
        key = key.lower()
        if self.open:
            return 0 if key in self._announced else None
        return 0 if key in self.configured else self.depths.get(key)

    def describe(self) -> str:
        if self.open:
            return f"OPEN: any peer announcing the trainer role ({len(self._announced)} now)"
        return (f"{len(self.configured)} configured key(s), {len(self.admitted)} admitted (quorum {self.quorum}, "
                f"depth {self.depth})")

    def mark_observed(self, peers: Iterable[PeerRecord]) -> None:
        """Learn from discovery: open, the announced trainers; keyed, admissions their records carry."""
        trainers = [p for p in peers if p.role == "trainer"]
        if self.open:
            self._announced = frozenset(k for k in map(bound_key, trainers) if k)
            return
        pending = [(bound_key(p), a) for p in trainers if (a := p.admission)]
        while pending:  # an admitted member may endorse the next: repeat until nothing changes
            before = len(self.admitted)
            pending = [(k, a) for k, a in pending if k and not self.is_member(k) and not self.mark_learned(k, a)]
            if len(self.admitted) == before:
                return

    def mark_learned(self, key: str, data: bytes) -> bool:
        """Admit ``key`` by ``data`` if it verifies now. A rejected admission is not checked again
        until the set changes, so a flood of bad ones costs one check each."""
        digest = hashlib.sha256(bytes(data)).digest() + bytes.fromhex(key)
        if self._rejected.get(digest) == len(self.members):
            return False
        try:
            adm = Admission.decode(data)
            if adm.key != key:
                raise IntegrityError("the admission names another key than its carrier's")
            self.mark_admitted(adm)
            return True
        except (WireError, IntegrityError) as exc:
            log.debug("admission carried by %s not accepted: %s", key_id_of(key), exc)
        self._rejected[digest] = len(self.members)
        while len(self._rejected) > _REJECTED_CAP:
            self._rejected.popitem(last=False)
        return False

    def check(self, admission: Admission) -> set[str]:
        """The members whose endorsements of ``admission`` verify, at least ``quorum`` of them
        within depth and unconvicted; ``IntegrityError`` if it does not admit its key into this set
        (nothing changes here)."""
        self._fits(admission)
        first = dict(reversed(admission.endorsements))  # one signature checked per member
        verified = {k for k, sig in first.items() if self.is_member(k) and admission.endorsed_by(k, sig)}
        self._depth_by(admission.key, verified)
        return verified

    def _depth_by(self, key: str, verified: Iterable[str]) -> int:
        """The depth ``key`` gets from the members in ``verified`` (their endorsements checked):
        one more than the deepest of the ``quorum`` shallowest that may endorse; ``IntegrityError``
        if fewer than ``quorum`` may."""
        depths = sorted(d for k in verified if (d := self.depth_of(k)) is not None and d < self.depth
                        and not self.convicted(k))
        if len(depths) < self.quorum:
            raise IntegrityError(f"admission of {key_id_of(key)} has {len(depths)} valid member endorsement(s) "
                                 f"within depth {self.depth} of the configured keys and unconvicted, needs "
                                 f"{self.quorum}")
        return 1 + depths[self.quorum - 1]

    def _fits(self, admission: Admission) -> None:
        if self.open:
            raise IntegrityError("an open trainer set has no admissions (configure trainer keys)")
        if admission.run_id != self.run_id:
            raise IntegrityError(f"admission is for run {admission.run_id!r}, not {self.run_id!r}")

    def mark_admitted(self, admission: Admission) -> None:
        """Add ``admission.key`` if ``quorum`` distinct members may and did endorse it (``check``);
        ``IntegrityError`` if not."""
        self._fits(admission)
        if self.is_member(admission.key):
            return
        if len(self.members) >= MAX_MEMBERS:
            raise IntegrityError(f"the trainer set is full ({MAX_MEMBERS} members)")
        endorsers = self.check(admission)
        self.admitted[admission.key] = admission
        self.depths[admission.key] = self._depth_by(admission.key, endorsers)
        self._endorsers[admission.key] = frozenset(endorsers)
        log.info("trainer %s admitted by %d members (depth %d)", key_id_of(admission.key), len(endorsers),
                 self.depths[admission.key])

    def mark_revised(self) -> set[str]:
        """Re-check every admission after a conviction (from the roots outwards, with the
        endorsements verified when it was learned); the keys revoked."""
        held = dict(self.admitted)
        self.admitted.clear()
        self.depths.clear()
        grew = True
        while grew:
            grew = False
            for key, adm in held.items():
                if key in self.admitted:
                    continue
                try:
                    depth = self._depth_by(key, self._endorsers[key] & self.members)
                except IntegrityError:
                    continue
                self.admitted[key], self.depths[key], grew = adm, depth, True
        revoked = set(held) - set(self.admitted)
        for key in revoked:
            del self._endorsers[key]
            log.warning("trainer %s revoked: its admission lost its endorsers to a conviction", key_id_of(key))
        return revoked
