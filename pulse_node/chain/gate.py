"""The version gate: which signed version records a node accepts. Checks only; it judges no peer.

A record passes when it is of this run, its signature verifies and its signer is a trainer-set
member, read through the read-only ``Membership`` interface: a ``Signers`` value the peer book
(``peers/book.py``) hands the gate whenever membership or its live part changes (configured and
admitted keys, or in an open swarm the announced trainers; never a convicted key; the members
live in discovery that announce a version). The gate never calls up into the book. What a
refusal means for whoever sent the record is the caller's to hand to the book
(``peers/outcomes.outcome_of``): a plain ``IntegrityError`` is the sender's lie, ``SignedWrong``
(a convicted signer, a far version) and ``Equivocation`` are not.

- **Believed by several.** Every verified record is its signer's vote for its chain hash (and
  for its parent's: a signer vouches for the history it extends). A version counts (``check``)
  once ``needed()`` distinct members vote for its chain hash: ``min_signers`` (default 2), but
  never more than the members live in discovery that announce a version, so a swarm with one
  trainer still runs, and one member alone moves no node that sees a second live member. A
  chain hash a quorum confirmed confirms its parent and its epoch (the genesis chain hash every
  record names), so history signed before a member joined counts once a quorum extends it, and a
  node joining late believes a genesis one member signed.
- **Equivocation.** Every verified record is remembered per (signer, parent chain hash, epoch)
  for the last ``SIGNED_CAP`` of them; a second one on the same parent with another chain hash
  raises ``Equivocation`` carrying both as evidence (``chain/evidence.py``), which the book
  checks and uses to convict the key. Records on another parent or epoch (a restart, a resume,
  a re-sync) are no conflict.
- **Bounded version step.** A record is refused (``FarVersion``) beyond ``max_version_step``
  past the highest version the *live* members other than its signer were seen signing, or the
  node's own head if higher (``saw``, ``admit``): one member cannot announce version 10^12 - 1
  and stall every node on a version nobody else makes, and a member that died never caps the
  survivors. Far records still count as seen, so two members a partition left far ahead vouch
  for each other; with no other live member seen there is no ceiling.
- **Bounded memory.** Votes are kept for the newest ``VOTED_CAP`` versions, confirmed chain
  hashes for the newest ``CONFIRMED_CAP``.
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
#: chain hashes a quorum confirmed, kept at most (the newest)
CONFIRMED_CAP = 4096
#: default ``min_signers`` (``chain.min_signers``)
MIN_SIGNERS = 2


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

    @property
    def live(self) -> frozenset[str]:
        """The members live in discovery now that announce a version (none convicted)."""
        ...


@dataclass(frozen=True)
class Signers:
    """A ``Membership`` as a value: what the peer book says now."""

    run_id: str
    keys: frozenset[str] = frozenset()
    convicted: frozenset[str] = frozenset()
    live: frozenset[str] = frozenset()


class SignedWrong(IntegrityError):
    """What a member signed is refused (its signer is convicted, or the signed statement does not
    match what it describes): whoever relayed it told no lie."""


class SignerConvicted(SignedWrong):
    """The record's signer is convicted of equivocation."""


class FarVersion(SignedWrong):
    """The record is too far past what the live members signed (``max_version_step``)."""


class Equivocation(IntegrityError):
    """The record's signer signed another record for this version; ``evidence`` proves it."""

    def __init__(self, message: str, *, evidence: bytes) -> None:
        super().__init__(message)
        self.evidence = evidence


class VersionGate:
    """Run, signature, signer, version-step, equivocation and quorum checks of version records."""

    def __init__(self, members: Membership, *, min_signers: int = MIN_SIGNERS,
                 max_version_step: int = VERSION_STEP) -> None:
        self.members = members  # replaced by the peer book whenever membership changes
        self.min_signers = min_signers
        self.max_version_step = max_version_step
        self.seen_high: dict[str, int] = {}  # member key -> highest version it was seen signing
        self.held = -1  # this node's own head: the highest version it signed or admitted
        self._signed: OrderedDict[tuple[str, str, str], VersionRecord] = OrderedDict()
        self.far_refused = 0
        self._votes: OrderedDict[int, dict[str, str]] = OrderedDict()  # version -> signer -> chain hash
        self._confirmed: OrderedDict[str, None] = OrderedDict()

    @property
    def run_id(self) -> str:
        return self.members.run_id

    def verify(self, record: VersionRecord, *, parent: VersionRecord | None = None) -> VersionRecord:
        """``record``, or ``IntegrityError`` unless a member signed it for this run (module docstring).

        The signature of a record equal to one verified before (kept per signer and parent) is
        not verified again; every other check is (``recheck_record``)."""
        if record.signer in self.members.convicted:
            raise SignerConvicted(f"record {record.short()}: signer {key_id_of(record.signer)} is convicted of "
                                  "equivocation")
        check = recheck_record if self._signed.get(_slot(record)) == record else verify_record
        check(record, run_id=self.run_id, trusted_signers=self.members.keys, parent=parent)
        self._check_step(record)
        self._check_equivocation(record)
        self._vote(record)
        return record

    def saw(self, record: VersionRecord) -> None:
        """A record this node signed or holds counts as seen (the version step's reference)."""
        self.held = max(self.held, record.version)
        self._seen(record)

    def _seen(self, record: VersionRecord) -> None:
        if record.signer not in self.seen_high and len(self.seen_high) >= SIGNED_CAP:
            return
        if record.version > self.seen_high.get(record.signer, -1):
            self.seen_high[record.signer] = record.version

    def ceiling(self, signer: str) -> int | None:
        """The highest version the live members but ``signer`` were seen signing, or our own head
        if higher; None while no other live member was seen signing (module docstring)."""
        live = self.members.live
        others = [v for k, v in self.seen_high.items() if k != signer and k in live]
        return max(others + [self.held]) if others else None

    def _check_step(self, record: VersionRecord) -> None:
        """``FarVersion`` if ``record`` is more than ``max_version_step`` past the ceiling
        (module docstring); counts it as seen either way."""
        ceiling = self.ceiling(record.signer)
        self._seen(record)
        if ceiling is not None and record.version > ceiling + self.max_version_step:
            self.far_refused += 1
            raise FarVersion(f"record {record.short()} of {key_id_of(record.signer)} is more than "
                             f"{self.max_version_step} versions past what the live trainer set signed ({ceiling})")

    def _check_equivocation(self, record: VersionRecord) -> None:
        """``Equivocation`` if the signer signed another record on the same parent and epoch."""
        slot = _slot(record)
        other = self._signed.get(slot)
        if other is None:
            self._signed[slot] = record
            while len(self._signed) > SIGNED_CAP:
                self._signed.popitem(last=False)
            return
        if other.chain_hash == record.chain_hash:
            return
        raise Equivocation(f"{key_id_of(record.signer)} signed two records for version {record.version} on one parent",
                           evidence=head_evidence(other, record).encode())

    def _vote(self, record: VersionRecord) -> None:
        """``record`` is its signer's vote for its chain hash and its parent's."""
        signer = record.signer.lower()
        for version, chain in ((record.version, record.chain_hash), (record.version - 1, record.parent_chain_hash)):
            if version < 0 or (version not in self._votes and len(self._votes) >= VOTED_CAP
                               and version < min(self._votes)):
                continue
            votes = self._votes.setdefault(version, {})
            votes[signer] = chain
            while len(self._votes) > VOTED_CAP:  # the oldest version's votes go first
                del self._votes[min(self._votes)]
        if record.chain_hash in self._confirmed or self._quorum(record.version, record.chain_hash):
            self._confirm(record.chain_hash, record.parent_chain_hash, record.epoch)

    def needed(self) -> int:
        """Distinct members that must sign a version: ``min_signers``, at most the live signers, at least 1."""
        return max(1, min(self.min_signers, len(self.members.live)))

    def _quorum(self, version: int, chain: str) -> bool:
        signers = self.members.keys
        votes = self._votes.get(version, {})
        return sum(1 for k, h in votes.items() if h == chain and k in signers) >= self.needed()

    def _confirm(self, *chains: str) -> None:
        for chain in chains:
            self._confirmed[chain] = None
            self._confirmed.move_to_end(chain)
        while len(self._confirmed) > CONFIRMED_CAP:
            self._confirmed.popitem(last=False)

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
        sealed = seal_checked(record, patch=patch, state=state)
        self.held = max(self.held, record.version)
        return sealed

    def check(self, record: VersionRecord, *, parent: VersionRecord | None = None) -> bool:
        """Verify one record; True once its chain hash has a quorum of member votes (``needed``),
        or is in the history of a chain hash that has."""
        self.verify(record, parent=parent)
        if record.chain_hash in self._confirmed:
            return True
        if self._quorum(record.version, record.chain_hash):
            self._confirm(record.chain_hash, record.parent_chain_hash, record.epoch)
            return True
        return False

    def forget_below(self, version: int) -> None:
        for v in [v for v in self._votes if v < version]:
            del self._votes[v]


def _slot(record: VersionRecord) -> tuple[str, str, str]:
    """Where a signer's record is remembered: one per (signer, parent chain hash, epoch)."""
    return record.signer, record.parent_chain_hash, record.epoch
