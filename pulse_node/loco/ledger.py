"""The trust ledger: what every trainer knows of every trainer's work, and the weights it gives (torch-free).

Part of the replicated outer state (``loco/outer.py``: covered by its state hash, served in the
trainer-state file a re-syncing trainer adopts), so every trainer computes the same weights bit
for bit. It changes only by ``record``, applying what a round's decision names (contributors,
their class, unrevealed commitments, spot-check verdicts, convictions), in the same way on
every trainer. Per key (a trainer's peer id): the first and last round it was named, rounds it
contributed, checks passed and failed, commitments left unrevealed, its standing, whether a
decision named it convicted. The verdicts of the last ``VERDICT_WINDOW`` rounds applied are
remembered, so a verdict named twice counts once.

A failed check (no answer, or a mismatch whose evidence convicts the target) makes a key
**owing**: it enters no round and is checked every round, by ``newcomer_verifiers`` verifiers,
until it passes one (an honest trainer a lying verifier marked unanswered is back after one
round; a trainer that never answers stays out). A member that has passed no check yet is
**unproven** (``unproven``): it is checked every round too (``trainer/spot_round.round_draws``,
the byzantine harness alike). Weights (``weights``):

- a **member** (a configured root or an admitted key: ``members`` as the decision names them)
  weighs 1;
- an **open trainer** (``chain.open_trainers``: any other key) earns weight by checks passed:
  ``min(1, max(0, passed - 2 * failed - unrevealed) / earn_checks)`` (a commitment it entered a
  round with and never revealed costs it a check's worth); until it passed ``newcomer_checks``
  checks it is a **newcomer**, and all newcomers of a round share ``newcomer_weight`` together,
  so 1 or 1,000 new keys weigh the same;
- an owing or convicted key weighs 0 (a convicted one for good).

Which newcomers enter a round at most (``entrants``): ``open_per_round`` of them, the lowest
BLAKE3(seed, key), the seed being the digest of the last decision the ledger applied (known to
every trainer only once the previous round closed). The ledger keeps at most ``max_entries``
keys: members first, then open trainers by standing (checks passed less failures); keys with none
(newcomers, convicted open trainers: back as newcomers, as fresh keys would be) go first, the least
recently named first.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import astuple, dataclass, field
from typing import Any

import blake3
import msgpack
import numpy as np

from pulse_node.errors import WireError
from pulse_node.loco.config import TrustConfig

LEDGER_MAGIC = "pulse/trust-ledger"
LEDGER_FORMAT = 1
MAX_LEDGER_BYTES = 4 << 20
_DOMAIN = b"pulse/trust-ledger/1\0"
_ENTRY_DOMAIN = b"pulse/round-entry/1\0"
_FIELDS = 9
VERDICT_WINDOW = 4  # a check of round r counts when a decision of rounds r + 1 .. r + VERDICT_WINDOW names it


@dataclass
class Entry:
    """One key's record (see the module docstring)."""

    first_round: int
    last_round: int
    member: bool = False
    contributed: int = 0
    passed: int = 0
    failed: int = 0
    unrevealed: int = 0
    owing: bool = False
    convicted: bool = False


@dataclass(frozen=True)
class Verdict:
    """A spot check's outcome as a decision names it: ``verifier`` checked ``target``'s round ``round``."""

    round: int
    target: str
    verifier: str
    passed: bool

    @property
    def key(self) -> tuple[int, str, str]:
        return self.round, self.target, self.verifier


@dataclass(frozen=True)
class RoundFacts:
    """What a decided round tells the ledger (the same on every trainer: read off the decision)."""

    round: int
    digest: bytes = b""  # of the decision (the next round's entry seed)
    contributors: tuple[str, ...] = ()  # whose payloads the round applied
    members: frozenset[str] = frozenset()  # the keys named here that are members (root or admitted)
    unrevealed: tuple[str, ...] = ()  # committed, never revealed
    verdicts: tuple[Verdict, ...] = ()
    convicted: tuple[str, ...] = ()  # keys the decision excludes for good (checked evidence)


@dataclass
class Ledger:
    """Per key, its work as the decisions named it; the weights that follow (module docstring)."""

    cfg: TrustConfig = field(default_factory=TrustConfig)
    entries: dict[str, Entry] = field(default_factory=dict)
    seed: bytes = b""
    applied: set[tuple[int, str, str]] = field(default_factory=set)  # verdicts counted, last rounds

    # ---- weights ----------------------------------------------------------------------------
    def newcomer(self, key: str, *, member: bool) -> bool:
        """An open trainer that has not passed ``newcomer_checks`` checks yet."""
        e = self.entries.get(key)
        return not member and (e is None or e.passed < self.cfg.newcomer_checks)

    def earned(self, key: str) -> float:
        """An open trainer's own weight once it is no newcomer, in [0, 1]."""
        e = self.entries.get(key)
        if e is None:
            return 0.0
        return min(1.0, max(0, e.passed - 2 * e.failed - e.unrevealed) / self.cfg.earn_checks)

    def unproven(self, key: str, *, member: bool) -> bool:
        """A member that has passed no check yet: checked every round, as a newcomer is, until it
        passes one, so a member that cannot answer (or cheats) is out after its first round, not
        after a ``1 / spot.rate`` wait."""
        e = self.entries.get(key)
        return member and (e is None or (e.passed == 0 and not e.convicted))

    def owing(self, key: str) -> bool:
        """It failed its last check (or never answered it): out of the rounds until it passes one."""
        e = self.entries.get(key)
        return e is not None and e.owing

    def weights(self, contributors: Iterable[str], *, members: Collection[str]) -> dict[str, float]:
        """Each contributor's weight in this round (FP32 values; newcomers share one weight)."""
        ids = sorted(set(contributors), key=str.encode)
        out_ = [k for k in ids if self.convicted(k) or self.owing(k)]
        new = [k for k in ids if self.newcomer(k, member=k in members) and k not in out_]
        share = self.cfg.newcomer_weight / len(new) if new else 0.0
        out = {}
        for k in ids:
            if k in out_:
                w = 0.0
            elif k in members:
                w = 1.0
            else:
                w = share if k in new else self.earned(k)
            out[k] = float(np.float32(w))
        return out

    def convicted(self, key: str) -> bool:
        e = self.entries.get(key)
        return e is not None and e.convicted

    # ---- who enters a round -----------------------------------------------------------------
    def rank(self, key: str) -> bytes:
        """A newcomer's place in this round's entry draw (lower enters first)."""
        return blake3.blake3(_ENTRY_DOMAIN + self.seed + key.encode()).digest()

    def entrants(self, newcomers: Iterable[str]) -> set[str]:
        """The newcomers among ``newcomers`` that enter this round: at most ``open_per_round``, lowest rank first."""
        ordered = sorted(set(newcomers), key=lambda k: (self.rank(k), k.encode()))
        return set(ordered[:self.cfg.open_per_round])

    # ---- the one way it changes -------------------------------------------------------------
    def record(self, facts: RoundFacts) -> None:
        """Apply a decided round (module docstring); every trainer calls it with the same facts."""
        r = facts.round
        for key in (*facts.contributors, *facts.unrevealed, *(v.target for v in facts.verdicts), *facts.convicted):
            e = self.entries.setdefault(key, Entry(first_round=r, last_round=r))
            e.last_round = max(e.last_round, r)
            e.member = key in facts.members
        for key in facts.contributors:
            self.entries[key].contributed += 1
        for key in facts.unrevealed:
            self.entries[key].unrevealed += 1
        for v in facts.verdicts:
            if v.key in self.applied or not 0 < r - v.round <= VERDICT_WINDOW:
                continue
            self.applied.add(v.key)
            e = self.entries[v.target]
            if v.passed:
                e.passed, e.owing = e.passed + 1, False
            else:
                e.failed, e.owing = e.failed + 1, True
        for key in facts.convicted:
            self.entries[key].convicted = True
        self.applied = {k for k in self.applied if r - k[0] <= VERDICT_WINDOW}
        self.seed = bytes(facts.digest)
        self._evict()

    def _evict(self) -> None:
        """Keep at most ``max_entries`` keys: members first, then open trainers by their standing
        (``_standing``), the least recently named going first among equals.

        Forgetting a key with no standing costs the swarm nothing: it comes back as a newcomer, as a
        fresh key (free to make) would, and is checked every round again. That holds for a convicted
        open trainer too, so a flood of throwaway keys convicted round after round displaces only
        such keys, never a member (a convicted member stays convicted) nor an open trainer's earned
        standing."""
        extra = len(self.entries) - self.cfg.max_entries
        if extra <= 0:
            return
        order = sorted(self.entries.items(), key=lambda kv: (kv[1].member, _standing(kv[1]), kv[1].last_round,
                                                             kv[0].encode()))
        for key, _ in order[:extra]:
            del self.entries[key]

    # ---- bytes ------------------------------------------------------------------------------
    def encode(self) -> bytes:
        rows = [[k, *astuple(e)] for k, e in sorted(self.entries.items(), key=lambda kv: kv[0].encode())]
        applied = [list(k) for k in sorted(self.applied, key=lambda k: (k[0], k[1].encode(), k[2].encode()))]
        return msgpack.packb([LEDGER_MAGIC, LEDGER_FORMAT, self.seed, rows, applied], use_bin_type=True)

    def digest(self) -> bytes:
        return blake3.blake3(_DOMAIN + self.encode()).digest()

    @classmethod
    def decode(cls, data: bytes, *, cfg: TrustConfig) -> Ledger:
        """Hostile bytes (a peer's trainer-state file) -> a ledger; ``WireError`` if malformed."""
        if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_LEDGER_BYTES:
            raise WireError(f"a trust ledger is bytes of at most {MAX_LEDGER_BYTES}")
        try:
            items = msgpack.unpackb(bytes(data), raw=False, use_list=True, max_map_len=0, max_ext_len=0,
                                    max_str_len=256, max_bin_len=64, max_array_len=max(cfg.max_entries, 16))
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise WireError(f"trust ledger is not valid msgpack ({type(exc).__name__})") from None
        if not (isinstance(items, list) and len(items) == 5 and items[:2] == [LEDGER_MAGIC, LEDGER_FORMAT]
                and type(items[2]) is bytes and isinstance(items[3], list) and len(items[3]) <= cfg.max_entries
                and isinstance(items[4], list)):
            raise WireError("not a trust ledger of a supported format")
        entries = {}
        for row in items[3]:
            entries[_key(row)] = _entry(row)
        applied = {_applied(k) for k in items[4]}
        if len(entries) != len(items[3]) or len(applied) != len(items[4]):
            raise WireError("a trust ledger names a key or a verdict twice")
        return cls(cfg, entries, items[2], applied)

    def report(self) -> Mapping[str, Entry]:
        return dict(self.entries)


def _standing(e: Entry) -> int:
    """What an open trainer would lose if forgotten: its checks passed, less twice those failed and
    its unrevealed commitments (what ``Ledger.earned`` counts); 0 for a convicted key."""
    return 0 if e.convicted else max(0, e.passed - 2 * e.failed - e.unrevealed)


def _key(row: object) -> str:
    if not (isinstance(row, list) and len(row) == 1 + _FIELDS and type(row[0]) is str and 0 < len(row[0]) <= 128):
        raise WireError("a trust ledger row is [key, first, last, member, contributed, passed, failed, "
                        "unrevealed, owing, convicted]")
    return row[0]


def _entry(row: list[Any]) -> Entry:
    ints, flags = (row[1], row[2], row[4], row[5], row[6], row[7]), (row[3], row[8], row[9])
    if not all(type(v) is int and 0 <= v < 2**63 for v in ints) or not all(type(v) is bool for v in flags):
        raise WireError("a trust ledger row has fields of the wrong types")
    return Entry(first_round=row[1], last_round=row[2], member=row[3], contributed=row[4], passed=row[5],
                 failed=row[6], unrevealed=row[7], owing=row[8], convicted=row[9])


def _applied(raw: object) -> tuple[int, str, str]:
    if not (isinstance(raw, list) and len(raw) == 3 and type(raw[0]) is int and 0 <= raw[0] < 2**63
            and type(raw[1]) is str and type(raw[2]) is str and len(raw[1]) <= 128 and len(raw[2]) <= 128):
        raise WireError("a trust ledger's applied verdict is [round, target, verifier]")
    return raw[0], raw[1], raw[2]


def total(weights: Mapping[str, float]) -> float:
    """The weights' exact sum (what ``min_contributors`` is compared with)."""
    return math.fsum(weights.values())
