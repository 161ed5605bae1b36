"""The version gate: which signed version records a node accepts. Checks only; it judges no peer.

A record passes when it is of this run, its signature verifies and its signer is a trainer-set
member, read through the read-only ``Membership`` interface: a ``Signers`` value the peer book
(``peers/book.py``) hands the gate whenever membership changes (configured and admitted keys, or
in an open swarm the announced trainers; never a convicted key). The gate never calls up into
the book. With
``min_signers = k > 1`` a version counts only once k distinct members signed records with the
same chain hash (``check``). What a refusal means for whoever sent the record is the caller's to
hand to the book (``peers/outcomes.outcome_of``): a plain ``IntegrityError`` is the sender's lie,
``SignedWrong`` (a convicted signer) and ``Equivocation`` are not.

Members are held to one member's share (``docs/ARCHITECTURE.md``, "Members held to one member's
share"):

- **Equivocation.** Every verified record is remembered per (signer, version) for the last
  ``SIGNED_CAP`` of them; a second one with another chain hash raises ``Equivocation`` carrying
  both as evidence (``chain/evidence.py``), which the book checks and uses to convict the key.
- **Bounded version step.** A record signed by ``s`` for a version beyond ``max_version_step`` past
  the highest version any *other* member was seen signing is refused: one member cannot announce
  version 10^12 - 1 and stall every node on a version nobody else makes. Far records still count
  as seen, so two members a partition left far ahead vouch for each other; a node that has seen
  no other member's record yet (a fresh one) cannot apply this.
- **Bounded memory.** Votes are kept for the newest ``VOTED_CAP`` versions at most.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from pulse_node.chain.evidence import head_evidence
from pulse_node.chain.identity import key_id_of
from pulse_node.chain.record import VersionRecord, check_patch, recheck_record, verify_record
from pulse_node.chain.verified import VerifiedVersion, seal_checked
from pulse_node.codec.patch import ParsedPatch
from pulse_node.codec.state import State
from pulse_node.errors import IntegrityError

#: verified records remembered per (signer, version), to catch a second, conflicting one
SIGNED_CAP = 4096
#: default ``max_version_step`` (``chain.max_version_step``)
VERSION_STEP = 64
#: versions whose signers' votes are kept (``check``), at most: the newest
VOTED_CAP = 1024


class Membership(Protocol):
    """Who may sign versions, as the gate reads it."""

    @property
    def run_id(self) -> str: ...

    @property
    def keys(self) -> frozenset[str]:
        """The keys whose records count now: trainer-set members, none convicted."""
        ...

    @property
    def convicted(self) -> frozenset[str]:
        """The keys convicted of equivocation."""
        ...


@dataclass(frozen=True)
class Signers:
    """A ``Membership`` as a value: what the peer book says now."""

    run_id: str
    keys: frozenset[str] = frozenset()
    convicted: frozenset[str] = frozenset()


class SignedWrong(IntegrityError):
    """What a member signed is refused (its signer is convicted, or the signed statement does not
    match what it describes): whoever relayed it told no lie."""


class SignerConvicted(SignedWrong):
    """The record's signer is convicted of equivocation."""


class Equivocation(IntegrityError):
    """The record's signer signed another record for this version; ``evidence`` proves it."""

    def __init__(self, message: str, *, evidence: bytes) -> None:
        super().__init__(message)
        self.evidence = evidence


class VersionGate:
    """Run, signature, signer, version-step, equivocation and quorum checks of version records."""

    def __init__(self, members: Membership, *, min_signers: int = 1, max_version_step: int = VERSION_STEP) -> None:
        self.members = members  # replaced by the peer book whenever membership changes
        self.min_signers = min_signers
        self.max_version_step = max_version_step
        self.seen_high: dict[str, int] = {}  # member key -> highest version it was seen signing
        self._signed: OrderedDict[tuple[str, int], VersionRecord] = OrderedDict()
        self.far_refused = 0
        self._votes: OrderedDict[int, dict[str, set[str]]] = OrderedDict()

    @property
    def run_id(self) -> str:
        return self.members.run_id

    def verify(self, record: VersionRecord, *, parent: VersionRecord | None = None) -> VersionRecord:
        """``record``, or ``IntegrityError`` unless a member signed it for this run (module docstring).

        The signature of a record equal to one verified before (kept per signer and version) is
        not verified again; every other check is (``recheck_record``)."""
        if record.signer in self.members.convicted:
            raise SignerConvicted(f"record {record.short()}: signer {key_id_of(record.signer)} is convicted of "
                                  "equivocation")
        check = recheck_record if self._signed.get((record.signer, record.version)) == record else verify_record
        check(record, run_id=self.run_id, trusted_signers=self.members.keys, parent=parent)
        self._check_step(record)
        self._check_equivocation(record)
        return record

    def saw(self, record: VersionRecord) -> None:
        """A record this node signed or holds counts as seen (the version step's reference)."""
        if record.signer not in self.seen_high and len(self.seen_high) >= SIGNED_CAP:
            return
        if record.version > self.seen_high.get(record.signer, -1):
            self.seen_high[record.signer] = record.version

    def _check_step(self, record: VersionRecord) -> None:
        """``IntegrityError`` if ``record`` is more than ``max_version_step`` past what the other
        members were seen signing (module docstring); counts it as seen either way."""
        convicted = self.members.convicted
        others = [v for k, v in self.seen_high.items() if k != record.signer and k not in convicted]
        self.saw(record)
        ceiling = max(others, default=None)
        if ceiling is not None and record.version > ceiling + self.max_version_step:
            self.far_refused += 1
            raise IntegrityError(f"record {record.short()} of {key_id_of(record.signer)} is more than "
                                 f"{self.max_version_step} versions past what the trainer set signed ({ceiling})")

    def _check_equivocation(self, record: VersionRecord) -> None:
        """``Equivocation`` if the signer signed another record for this version."""
        slot = (record.signer, record.version)
        other = self._signed.get(slot)
        if other is None:
            self._signed[slot] = record
            while len(self._signed) > SIGNED_CAP:
                self._signed.popitem(last=False)
            return
        if other.chain_hash == record.chain_hash:
            return
        raise Equivocation(f"{key_id_of(record.signer)} signed two records for version {record.version}",
                           evidence=head_evidence(other, record).encode())

    def admit(self, record: VersionRecord, *, patch: bytes | ParsedPatch | None = None,
              state: State | None = None, parent: VersionRecord | None = None,
              digest_seen: bool = False) -> VerifiedVersion:
        """The trust gate: ``record`` verified (``verify``), ``patch`` checked against it (size and
        digest; the header, parsed once, must name the record's state), ``state`` hashed once; the
        result is what the store and the apply take. ``digest_seen``: the patch's size and digest
        were compared with this record's while it streamed in (``inference/streaming.py``)."""
        self.verify(record, parent=parent)
        if patch is not None and not digest_seen:
            check_patch(record, patch.data if isinstance(patch, ParsedPatch) else patch)
        return seal_checked(record, patch=patch, state=state)

    def check(self, record: VersionRecord, *, parent: VersionRecord | None = None) -> bool:
        """Verify one record; True once its version has a quorum of agreeing trusted signers."""
        self.verify(record, parent=parent)
        votes = self._votes.get(record.version)
        if votes is None:
            votes = self._votes[record.version] = {}
            while len(self._votes) > VOTED_CAP:  # the oldest version's votes go first
                del self._votes[min(self._votes)]
        signers = votes.setdefault(record.chain_hash, set())
        signers.add(record.signer.lower())
        return len(signers) >= self.min_signers

    def forget_below(self, version: int) -> None:
        for v in [v for v in self._votes if v < version]:
            del self._votes[v]
