"""Which signed version records a node accepts, and which peers it still listens to.

A record is accepted when it is of this run, its signature verifies and its signer is a member
of the trainer set (``chain/trainerset.py``: the configured and admitted trainer keys, or, in an
open swarm, the keys of the peers announcing the trainer role). With ``min_signers = k > 1`` a
version is accepted only after k distinct members signed records with the same chain hash.
Rejections are counted per sender; ``max_strikes`` of them ban the sender for ``ban_s``,
doubling with every further ban up to ``max_ban_s``. Bans are bounded because damaged bytes from an honest peer (a flaky link, a
bad disk) look exactly like a lie: a liar keeps re-earning longer bans, an honest peer that
had a bad minute comes back.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Callable, Iterable

from pulse_node.chain.identity import peer_id_of_key
from pulse_node.chain.record import VersionRecord, verify_record
from pulse_node.chain.trainerset import TrainerSet, bound_key
from pulse_node.errors import IntegrityError


class TrustPolicy:
    """Run, signature, signer and quorum checks for version records; per-peer strike counts."""

    def __init__(self, trainers: TrainerSet, *, min_signers: int = 1, max_strikes: int = 3,
                 ban_s: float = 60.0, max_ban_s: float = 3600.0) -> None:
        self.trainers = trainers
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

    def observe(self, peers: Iterable) -> None:
        """Let the trainer set learn from discovery (admissions; an open set's announced trainers)."""
        self.trainers.observe(peers)
        self._tell_members()

    def listen_members(self, tell: Callable[[frozenset[str]], None]) -> None:
        """Call ``tell`` with the members' peer ids now and whenever the set changes."""
        self.on_members, self._told = tell, None
        self._tell_members()

    def _tell_members(self) -> None:
        members = self.trainers.members
        if self.on_members is not None and members != self._told:
            self._told = members
            self.on_members(frozenset(peer_id_of_key(k) for k in members))

    def vouches_for(self, peer) -> bool:
        """Whether ``peer`` is a trainer-set member (by the key its peer id encodes)."""
        return self.trainers.is_member(bound_key(peer))

    def ignored(self, peer_id: str) -> bool:
        """Banned peers until their ban ends; peers that keep failing, for a cool-down after each failure."""
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
        """``IntegrityError`` (and a strike for ``sender``) unless a member signed ``record`` for this run."""
        try:
            verify_record(record, run_id=self.trainers.run_id, trusted_signers=self.trainers.members,
                          parent=parent)
        except IntegrityError:
            self.strike(sender)
            raise

    def check(self, record: VersionRecord, *, sender: str, parent: VersionRecord | None = None) -> bool:
        """Verify one record; True once its version has a quorum of agreeing trusted signers."""
        self.verify(record, sender=sender, parent=parent)
        votes = self._votes[record.version][record.chain_hash]
        votes.add(record.signer.lower())
        return len(votes) >= self.min_signers

    def forget_below(self, version: int) -> None:
        for v in [v for v in self._votes if v < version]:
            del self._votes[v]
