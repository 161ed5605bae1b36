"""Which signed version records an inference node accepts.

A record is accepted when its signature verifies and its signer is trusted: one of the
configured trainer keys or, when none are configured (a local swarm), any peer that announces
the trainer role. With ``min_signers = k > 1`` a version is accepted only after k distinct
trusted trainers signed records with the same chain hash. Rejections are counted per sender;
``max_strikes`` of them ban the sender for ``ban_s``, doubling with every further ban up to
``max_ban_s``. Bans are bounded because damaged bytes from an honest peer (a flaky link, a
bad disk) look exactly like a lie: a liar keeps re-earning longer bans, an honest peer that
had a bad minute comes back.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Iterable

from pulse_node.chain.record import VersionRecord, verify_record
from pulse_node.errors import IntegrityError


class TrustPolicy:
    """Signature, signer and quorum checks for version records; per-peer strike counts."""

    def __init__(self, *, trusted: Iterable[str] = (), min_signers: int = 1, max_strikes: int = 3,
                 ban_s: float = 60.0, max_ban_s: float = 3600.0) -> None:
        self.trusted = {k.lower() for k in trusted}
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

    def signers(self, trainer_keys: Iterable[str]) -> set[str]:
        """Keys trusted right now: configured ones, else the announced trainers'."""
        return set(self.trusted) if self.trusted else {k.lower() for k in trainer_keys if k}

    def vouches_for(self, node_key: str) -> bool:
        """Whether a peer announcing ``node_key`` could sign acceptable records at all."""
        return not self.trusted or node_key.lower() in self.trusted

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

    def check(self, record: VersionRecord, *, sender: str, trainer_keys: Iterable[str],
              parent: VersionRecord | None = None) -> bool:
        """Verify one record; True once its version has a quorum of agreeing trusted signers."""
        try:
            verify_record(record, trusted_signers=self.signers(trainer_keys), parent=parent)
        except IntegrityError:
            self.strike(sender)
            raise
        votes = self._votes[record.version][record.chain_hash]
        votes.add(record.signer.lower())
        return len(votes) >= self.min_signers

    def forget_below(self, version: int) -> None:
        for v in [v for v in self._votes if v < version]:
            del self._votes[v]
