"""Which signed version records a node accepts, and which peers it still listens to.

A record is accepted when it is of this run, its signature verifies and its signer is a member
of the trainer set (``chain/trainerset.py``: the configured and admitted trainer keys, or, in an
open swarm, the keys of the peers announcing the trainer role). With ``min_signers = k > 1`` a
version is accepted only after k distinct members signed records with the same chain hash.
Rejections are counted per sender; ``max_strikes`` of them ban the sender for ``ban_s``,
doubling with every further ban up to ``max_ban_s``. Bans are bounded because damaged bytes from an honest peer (a flaky link, a
bad disk) look exactly like a lie: a liar keeps re-earning longer bans, an honest peer that
had a bad minute comes back.

Members are held to one member's share (``docs/ARCHITECTURE.md``, "Members held to one member's
share"):

- **Equivocation.** Every verified record is remembered per (signer, version) for the last
  ``SIGNED_CAP`` of them; a second one with another chain hash is evidence (``chain/evidence.py``).
  A convicted key (``evidence``, an ``EvidenceBook``, which also takes evidence other nodes send)
  is refused everywhere: its records fail ``verify``, ``vouches_for`` is False, its peer id is
  ``ignored``; it leaves this node's effective trainer set.
- **Bounded version step.** A record signed by ``s`` for a version beyond ``max_version_step`` past
  the highest version any *other* member was seen signing is refused (and strikes the sender):
  one member cannot announce version 10^12 - 1 and stall every node on a version nobody else
  makes. Far records still count as seen, so two members a partition left far ahead vouch for
  each other; a node that has seen no other member's record yet (a fresh one) cannot apply this.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable

from pulse_node.chain.evidence import EvidenceBook, head_evidence
from pulse_node.chain.identity import key_id_of, key_of_peer_id, peer_id_of_key
from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import VersionRecord, check_patch, recheck_record, verify_record
from pulse_node.chain.trainerset import TrainerSet, bound_key
from pulse_node.chain.verified import VerifiedVersion, seal_checked
from pulse_node.codec.patch import ParsedPatch
from pulse_node.codec.state import State
from pulse_node.errors import IntegrityError, WireError

#: verified records remembered per (signer, version), to catch a second, conflicting one
SIGNED_CAP = 4096
#: default ``max_version_step`` (``chain.max_version_step``)
VERSION_STEP = 64


class TrustPolicy:
    """Run, signature, signer and quorum checks for version records; per-peer strike counts."""

    def __init__(self, trainers: TrainerSet, *, min_signers: int = 1, max_strikes: int = 3,
                 ban_s: float = 60.0, max_ban_s: float = 3600.0, max_version_step: int = VERSION_STEP,
                 evidence: EvidenceBook | None = None) -> None:
        self.trainers = trainers
        self.evidence = evidence if evidence is not None else EvidenceBook(run_id=trainers.run_id)
        self.evidence.admit = trainers.is_member
        self.max_version_step = max_version_step
        self.seen_high: dict[str, int] = {}  # member key -> highest version it was seen signing
        self._signed: OrderedDict[tuple[str, int], VersionRecord] = OrderedDict()
        self.far_refused = 0
        self.min_signers = min_signers
        self.max_strikes = max_strikes
        self.ban_s, self.max_ban_s = ban_s, max_ban_s
        self.strikes: Counter[str] = Counter()  # all rejections per sender (reported)
        self.bans: Counter[str] = Counter()
        self._since_ban: Counter[str] = Counter()
        self._banned_until: dict[str, float] = {}
        self.failures: Counter[str] = Counter()  # consecutive failed requests per peer
        self.max_failures = 20
        self.cooldown_s = 30.0
        self._last_failure: dict[str, float] = {}
        self.rejected = 0
        self._votes: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        #: told the members' peer ids whenever the set changes (the data plane serves them first)
        self.on_members: Callable[[frozenset[str]], None] | None = None
        self._told: frozenset[str] | None = None

    def observe(self, peers: Iterable[PeerRecord]) -> None:
        """Let the trainer set learn from discovery (admissions; an open set's announced trainers)."""
        self.trainers.observe(peers)
        self._tell_members()

    def listen_members(self, tell: Callable[[frozenset[str]], None]) -> None:
        """Call ``tell`` with the members' peer ids now and whenever the set changes."""
        self.on_members, self._told = tell, None
        self._tell_members()

    def _tell_members(self) -> None:
        members = frozenset(k for k in self.trainers.members if k not in self.evidence)
        if self.on_members is not None and members != self._told:
            self._told = members
            self.on_members(frozenset(peer_id_of_key(k) for k in members))

    def vouches_for(self, peer: PeerRecord) -> bool:
        """Whether ``peer`` is a trainer-set member (by the key its peer id encodes), not convicted."""
        key = bound_key(peer)
        return self.trainers.is_member(key) and key not in self.evidence

    def is_member(self, key: str) -> bool:
        """Whether ``key`` is in this node's effective trainer set (a member not convicted)."""
        return self.trainers.is_member(key) and key.lower() not in self.evidence

    def convicted(self, peer_id: str) -> bool:
        """Whether ``peer_id`` speaks for a key convicted of equivocation (libp2p ids)."""
        try:
            return key_of_peer_id(peer_id) in self.evidence
        except WireError:
            return False

    def ignored(self, peer_id: str) -> bool:
        """Banned peers until their ban ends; peers that keep failing, for a cool-down after each
        failure; convicted keys for good."""
        if self.convicted(peer_id):
            return True
        if time.monotonic() < self._banned_until.get(peer_id, float("-inf")):
            return True
        cooling = time.monotonic() - self._last_failure.get(peer_id, float("-inf")) < self.cooldown_s
        return self.failures[peer_id] >= self.max_failures and cooling

    def failed(self, peer_id: str) -> None:
        """A request to the peer failed (timeout, refused, not served): not a lie, but it counts."""
        self.failures[peer_id] += 1
        self._last_failure[peer_id] = time.monotonic()

    def served(self, peer_id: str) -> None:
        """A request succeeded: the peer's failure streak ends."""
        self.failures.pop(peer_id, None)

    def strike(self, peer_id: str) -> None:
        """The peer sent something false or damaged; every ``max_strikes`` of them ban it."""
        self.rejected += 1
        self.strikes[peer_id] += 1
        self._since_ban[peer_id] += 1
        if self._since_ban[peer_id] >= self.max_strikes:
            self._since_ban[peer_id] = 0
            self.bans[peer_id] += 1
            ban = min(self.max_ban_s, self.ban_s * 2 ** (self.bans[peer_id] - 1))
            self._banned_until[peer_id] = time.monotonic() + ban

    def verify(self, record: VersionRecord, *, sender: str, parent: VersionRecord | None = None) -> None:
        """``IntegrityError`` (and a strike for ``sender``) unless a member signed ``record`` for this run.

        The signature of a record equal to one verified before (kept per signer and version) is
        not verified again; every other check is (``recheck_record``)."""
        if record.signer in self.evidence:
            raise IntegrityError(f"record {record.short()}: signer {key_id_of(record.signer)} is convicted of "
                                 "equivocation")
        check = recheck_record if self._signed.get((record.signer, record.version)) == record else verify_record
        try:
            check(record, run_id=self.trainers.run_id, trusted_signers=self.trainers.members, parent=parent)
            self._check_step(record)
        except IntegrityError:
            self.strike(sender)
            raise
        self._check_equivocation(record)

    def saw(self, record: VersionRecord) -> None:
        """A record this node signed or holds counts as seen (the version step's reference)."""
        if record.signer not in self.seen_high and len(self.seen_high) >= SIGNED_CAP:
            return
        if record.version > self.seen_high.get(record.signer, -1):
            self.seen_high[record.signer] = record.version

    def _check_step(self, record: VersionRecord) -> None:
        """``IntegrityError`` if ``record`` is more than ``max_version_step`` past what the other
        members were seen signing (module docstring); counts it as seen either way."""
        others = [v for k, v in self.seen_high.items() if k != record.signer and k not in self.evidence]
        self.saw(record)
        ceiling = max(others, default=None)
        if ceiling is not None and record.version > ceiling + self.max_version_step:
            self.far_refused += 1
            raise IntegrityError(f"record {record.short()} of {key_id_of(record.signer)} is more than "
                                 f"{self.max_version_step} versions past what the trainer set signed ({ceiling})")

    def _check_equivocation(self, record: VersionRecord) -> None:
        """Convict the signer if it signed another record for this version (``IntegrityError``)."""
        slot = (record.signer, record.version)
        other = self._signed.get(slot)
        if other is None:
            self._signed[slot] = record
            while len(self._signed) > SIGNED_CAP:
                self._signed.popitem(last=False)
            return
        if other.chain_hash == record.chain_hash:
            return
        ev = head_evidence(other, record)
        self.evidence.add(ev.kind, ev.first, ev.second)
        raise IntegrityError(f"{key_id_of(record.signer)} signed two records for version {record.version}: "
                             "convicted of equivocation")

    def admit(self, record: VersionRecord, *, sender: str, patch: bytes | ParsedPatch | None = None,
              state: State | None = None, parent: VersionRecord | None = None,
              digest_seen: bool = False) -> VerifiedVersion:
        """The trust gate: ``record`` verified (``verify``), ``patch`` checked against it (size and
        digest: a mismatch strikes ``sender``; the header, parsed once, must name the record's
        state), ``state`` hashed once; the result is what the store and the apply take.
        ``digest_seen``: the patch's size and digest were compared with this record's while it
        streamed in (``inference/streaming.py``, which strikes a mismatch), not again here."""
        self.verify(record, sender=sender, parent=parent)
        if patch is not None and not digest_seen:
            try:
                check_patch(record, patch.data if isinstance(patch, ParsedPatch) else patch)
            except IntegrityError:
                self.strike(sender)
                raise
        return seal_checked(record, patch=patch, state=state)

    def check(self, record: VersionRecord, *, sender: str, parent: VersionRecord | None = None) -> bool:
        """Verify one record; True once its version has a quorum of agreeing trusted signers."""
        self.verify(record, sender=sender, parent=parent)
        votes = self._votes[record.version][record.chain_hash]
        votes.add(record.signer.lower())
        return len(votes) >= self.min_signers

    def forget_below(self, version: int) -> None:
        for v in [v for v in self._votes if v < version]:
            del self._votes[v]
