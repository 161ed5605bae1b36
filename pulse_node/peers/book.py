"""The peer book: everything this node thinks of a peer, decided in one place.

It owns the trainer set (``peers/trainerset.py``: configured and admitted keys, or the announced
trainers of an open swarm), the evidence book (``peers/evidence.py``: keys convicted of
equivocation), strikes, bans and failure cool-downs (``peers/strikes.py``), earned standing and
the one ordering of peers built on it (``peers/standing.py``), the trainers a round takes part
with, and the node's version gate (``chain/gate.py``), which reads membership through the book.

- **One way in.** ``judge(peer_id, outcome)`` with what the peer did, as a value
  (``peers/outcomes.py``); each outcome is recorded once, in every ledger it concerns. A call
  that can fail because of a peer goes through ``ask``, which turns its fault into a value,
  judges it and returns it; pushed data is handled through ``contain``. Both are the one
  boundary where an exception no check anticipated is contained (``peers/contain.py``).
  ``observe`` takes what discovery shows (admissions, time seen).
- **Read-only queries.** Whom to ignore (``ignored``, ``heeded``), who is a member
  (``is_member``, ``vouches_for``, ``member_peer``, ``key_of``), the live trainers
  (``live_trainers``), whom to ask first (``order``, ``providers``, ``fetch_order``,
  ``known``) and what the transport's workers should know (``view``, a ``PeerView``).

A trainer-set member's key stays remembered for the round agreement after it leaves discovery
(at most ``KNOWN_CAP`` of them), so a decision naming a trainer that just died is still valid;
a key convicted of equivocation is no member anywhere from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from pulse_node.chain.evidence import Evidence
from pulse_node.chain.gate import MIN_SIGNERS, VERSION_STEP, Signers, VersionGate
from pulse_node.chain.identity import key_of_peer_id, peer_id_of_key
from pulse_node.chain.peer import PeerRecord
from pulse_node.config import NodeConfig
from pulse_node.errors import IntegrityError, PulseError, WireError
from pulse_node.loco.equivocation import evidence_checkers
from pulse_node.peers.contain import Containment
from pulse_node.peers.evidence import EvidenceBook
from pulse_node.peers.outcomes import (
    Accepted,
    Delivered,
    Failed,
    Fault,
    Lied,
    Outcome,
    Relayed,
    Reported,
    Unexpected,
    Unreached,
    outcome_of,
)
from pulse_node.peers.standing import FETCH_UNKNOWN, Standing
from pulse_node.peers.strikes import Strikes
from pulse_node.peers.trainerset import TrainerSet, bound_key, sender_key
from pulse_node.peers.view import VIEW_STANDING, PeerView

T = TypeVar("T")
KNOWN_CAP = 4096  # member peer ids whose key is remembered after they leave discovery
OPEN_CONVICTED = 64  # open trainers' convictions a book keeps at most (the rest of MAX_CONVICTED is the members')


class PeerBook:
    """What this node thinks of every peer (see the module docstring)."""

    def __init__(self, trainers: TrainerSet, *, evidence: EvidenceBook | None = None,
                 strikes: Strikes | None = None, standing: Standing | None = None, min_signers: int = MIN_SIGNERS,
                 max_version_step: int = VERSION_STEP, open_trainers: bool = False) -> None:
        self.trainers = trainers
        self.evidence = evidence if evidence is not None else EvidenceBook(run_id=trainers.run_id)
        self.open_trainers = open_trainers  # ``chain.open_trainers``: open trainers' equivocation convicts them too
        self.evidence.admit = self._convictable
        trainers.convicted = self.evidence.__contains__  # a convicted key endorses nothing
        self.ledger = strikes if strikes is not None else Strikes()
        self.standing = standing if standing is not None else Standing()
        self.containment = Containment()
        self.gate = VersionGate(Signers(trainers.run_id), min_signers=min_signers, max_version_step=max_version_step)
        self._known: dict[str, str] = {}  # member peer id -> its key, as seen in discovery
        self._discovered: list[PeerRecord] = []
        self._live: frozenset[str] = frozenset()  # member trainers in discovery that announce a version
        self._members_told: tuple[frozenset[str], frozenset[str]] | None = None
        self._members_changed()

    @classmethod
    def for_node(cls, cfg: NodeConfig) -> PeerBook:
        """The book of a node with config ``cfg``: its trainer set, its evidence on disk
        (``<data_dir>/evidence``, every kind ``loco/equivocation.py`` checks), its version gate."""
        evidence = EvidenceBook(run_id=cfg.run_id, directory=Path(cfg.data_dir) / "evidence",
                                checkers=evidence_checkers())
        return cls(TrainerSet.from_config(cfg.chain, run_id=cfg.run_id), evidence=evidence,
                   min_signers=cfg.chain.min_signers, max_version_step=cfg.chain.max_version_step,
                   open_trainers=cfg.chain.open_trainers)

    def _convictable(self, key: str) -> bool | None:
        """Whether evidence against ``key`` convicts it: a member's always; with ``chain.open_trainers``
        an open trainer's while open trainers hold fewer than ``OPEN_CONVICTED`` convictions (None:
        past that, the evidence checks out but is not kept, and its reporter did not lie)."""
        if self.trainers.is_member(key):
            return True
        if not self.open_trainers:
            return False
        held = sum(1 for k in self.evidence.convicted if not self.trainers.is_member(k))
        return True if held < OPEN_CONVICTED else None

    # ---- the way in -------------------------------------------------------------------
    def judge(self, peer_id: str, outcome: Outcome) -> Outcome:
        """Record what ``peer_id`` did; returns what was recorded (a ``Reported`` evidence that
        does not check out is recorded as the reporter's ``Lied``)."""
        s = self.standing
        if isinstance(outcome, Delivered):
            self.ledger.mark_served(peer_id)
            s.mark_delivered(peer_id)
        elif isinstance(outcome, Accepted):
            s.mark_accepted(peer_id)
        elif isinstance(outcome, Relayed):
            s.mark_relayed(peer_id)
        elif isinstance(outcome, Unreached):
            s.mark_failure(peer_id)
        elif isinstance(outcome, Reported):
            return self._reported(peer_id, outcome)
        elif isinstance(outcome, Failed):
            self.ledger.mark_failure(peer_id)
            s.mark_failure(peer_id)
        elif isinstance(outcome, Lied) or (isinstance(outcome, Unexpected) and outcome.struck):
            self.ledger.mark_strike(peer_id)
            s.mark_strike(peer_id)
        return outcome  # Busy, an Unexpected while backing off: nothing to record

    def _reported(self, peer_id: str, outcome: Reported) -> Outcome:
        try:
            self.evidence.mark_evidence(outcome.evidence)
        except (WireError, IntegrityError) as exc:
            return self.judge(peer_id, Lied(f"evidence that does not check out: {exc}"))
        self.trainers.mark_revised()  # admissions its key endorsed may fall with it
        self._members_changed()
        return outcome

    def ask(self, peer_id: str, call: Callable[[], T], *, then: Outcome | None = None,
            lies: tuple[type[PulseError], ...] = (), what: str = "") -> T | Fault:
        """``call()`` (a request to ``peer_id``, or a check of what it sent), its fault turned into a
        value and judged (``outcome_of``; ``lies``: further error types that are the peer's lie;
        any other exception: ``Unexpected``, ``peers/contain.py``, at boundary ``what``, by
        default the call's name); ``then`` is judged when it returned a value (not None)."""
        try:
            got = self.contain(peer_id, call, what=what or _name(call))
        except PulseError as exc:
            fault = outcome_of(exc, lies=lies)
            recorded = self.judge(peer_id, fault)
            return recorded if isinstance(recorded, Fault) else fault
        if isinstance(got, Unexpected):
            return got
        if then is not None and got is not None:
            self.judge(peer_id, then)
        return got

    def contain(self, peer_id: str, call: Callable[[], T], *, what: str) -> T | Unexpected:
        """``call()`` handling what ``peer_id`` sent (a pushed event; ``what``: the boundary), or
        the ``Unexpected`` it raised instead, judged (``peers/contain.py``); a ``PulseError``
        propagates to the caller's own handling."""
        got = self.containment.run(peer_id, call, what=what)
        if isinstance(got, Unexpected):
            self.judge(peer_id, got)
        return got

    def observe(self, peers: Iterable[PeerRecord]) -> None:
        """Learn from discovery: admissions (and an open set's announced trainers), the keys peers
        announce (``key_of``); time seen starts."""
        self._discovered = list(peers)
        self.trainers.mark_observed(self._discovered)
        self.standing.mark_seen(p.peer_id for p in self._discovered)
        self._live = frozenset(k for p in self._discovered if p.role == "trainer" and not p.leaving and p.head >= 0
                               and self.trainers.is_member(k := bound_key(p)))
        self._members_changed()

    def heed(self, peers: Iterable[PeerRecord]) -> list[PeerRecord]:
        """``observe`` ``peers``, then the ones not ignored."""
        self.observe(peers)
        return self.heeded(self._discovered)

    def view_of(self, found: Iterable[PeerRecord], *, newcomers: int, claims: int) -> tuple[list[PeerRecord], PeerView]:
        """A node's view of what discovery ``found`` (``observe``): members, peers with standing,
        at most ``newcomers`` others, and at most ``claims`` more trainers carrying an admission
        (so admissions are learned); with the ``PeerView`` the workers should hold now."""
        self.observe(found)
        view = self.order(self._discovered, quota=newcomers)
        taken = {p.peer_id for p in view}
        carrying = [p for p in self._discovered if p.role == "trainer" and p.admission and p.peer_id not in taken]
        return view + self.order(carrying, quota=claims), self.view()

    def _members_changed(self) -> None:
        """When the effective set or its live part changes: the gate gets it as a value (it never
        asks us), and members come first in every order."""
        keys, live = self.signers(), self.live_signers()
        if (keys, live) != self._members_told:
            if self._members_told is None or keys != self._members_told[0]:
                self.standing.mark_members(peer_id_of_key(k) for k in keys)
            self._members_told = keys, live
            self.gate.members = Signers(self.run_id, keys, frozenset(self.evidence.convicted), live)

    # ---- membership ------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.trainers.run_id

    @property
    def open(self) -> bool:
        """Whether any peer announcing the trainer role is a member (no key configured)."""
        return self.trainers.open

    def describe(self) -> str:
        return self.trainers.describe()

    def signers(self) -> frozenset[str]:
        """The effective trainer set: members not convicted."""
        return frozenset(k for k in self.trainers.members if k not in self.evidence)

    def convicted(self, key: str) -> bool:
        return key in self.evidence

    def live_signers(self) -> frozenset[str]:
        """The members in the last discovery view that announce a version and are not leaving,
        none convicted (whom the version gate counts)."""
        return frozenset(k for k in self._live if k not in self.evidence and self.trainers.is_member(k))

    def own_depth(self, key: str, admission: bytes | None) -> int | None:
        """``depth`` of this node's own ``key``, its ``admission`` (if any) learned first: a trainer's
        class before any peer showed it its own record."""
        if self.depth(key) is None and not self.open and admission:
            self.trainers.mark_learned(key, admission)
        return 0 if self.open and self.depth(key) is None else self.depth(key)

    def depth(self, key: str) -> int | None:
        """The member's class: 0 for a root (a configured key), n for a key admitted at depth n
        (``peers/trainerset.py``); None for a non-member or a convicted key."""
        return None if key.lower() in self.evidence else self.trainers.depth_of(key)

    def is_member(self, key: str) -> bool:
        """Whether ``key`` is in this node's effective trainer set (a member not convicted)."""
        return self.trainers.is_member(key) and key.lower() not in self.evidence

    def vouches_for(self, peer: PeerRecord) -> bool:
        """Whether ``peer`` is a member by the key its peer id encodes, not convicted."""
        return self.is_member(bound_key(peer))

    def live_trainers(self, peers: Iterable[PeerRecord]) -> dict[str, PeerRecord]:
        """The live trainer-set members among ``peers`` (admissions learned from them first); each
        one's key is remembered so it stays a member for the round agreement once it left."""
        self.observe(peers)
        live = {p.peer_id: p for p in self._discovered if p.role == "trainer" and self.vouches_for(p)}
        for pid in live:
            if pid not in self._known and len(self._known) < KNOWN_CAP:
                self._known[pid] = sender_key(pid, self._discovered)
        return live

    def key_of(self, peer_id: str) -> str:
        """The key ``peer_id`` speaks for ("" if unknown): the one its id encodes, else (test hub)
        the one its discovery record announces, else the one remembered."""
        return sender_key(peer_id, self._discovered) or self._known.get(peer_id, "")

    def member_peer(self, peer_id: str) -> bool:
        """Whether ``peer_id`` speaks for a member (a remembered live member counts while its key
        is in the set and not convicted)."""
        known = self._known.get(peer_id)
        if known is not None and known in self.evidence:
            return False
        if known is not None and (self.trainers.open or self.trainers.is_member(known)):
            return True
        return self.is_member(self.key_of(peer_id))

    def remembered(self, peer_id: str) -> bool:
        """Whether ``peer_id`` was seen as a live member."""
        return peer_id in self._known

    def ignored(self, peer_id: str) -> bool:
        """Banned peers until their ban ends; peers that keep failing, for a cool-down after each
        failure; peers speaking for a convicted key, for good."""
        return self.ledger.ignored(peer_id) or (bool(self.evidence.convicted) and self._convicted_peer(peer_id))

    def _convicted_peer(self, peer_id: str) -> bool:
        try:
            return key_of_peer_id(peer_id) in self.evidence
        except WireError:
            return self.key_of(peer_id) in self.evidence

    def heeded(self, peers: Iterable[PeerRecord]) -> list[PeerRecord]:
        """``peers`` but the ignored ones."""
        return [p for p in peers if not self.ignored(p.peer_id)]

    # ---- ordering ---------------------------------------------------------------------------
    @property
    def changes(self) -> int:
        """Bumped by every outcome that can move a peer in the order."""
        return self.standing.changes

    def epoch(self) -> int:
        """Which draw of newcomers is current."""
        return self.standing.epoch()

    def known(self, peer_id: str) -> bool:
        """A member, or a peer with standing (verified work) that lost none of it."""
        return self.standing.known(peer_id)

    def order(self, items: list[PeerRecord], *, quota: int) -> list[PeerRecord]:
        """Members, then peers with standing by score, then at most ``quota`` others (``peers/standing.py``)."""
        return self.standing.order(items, quota=quota)

    def providers(self, items: list[T], *, key: Callable[[T], str], quota: int = FETCH_UNKNOWN) -> list[T]:
        """Who to fetch from: peers that delivered before, members, at most ``quota`` others."""
        return self.standing.providers(items, quota=quota, key=key)

    def fetch_order(self, holders: list[PeerRecord], *, copies: Collection[str], first_hand: bool,
                    wait: bool) -> list[PeerRecord]:
        """Whom to fetch a fresh version from, in order: peers that delivered before, members, at most
        ``FETCH_UNKNOWN`` others. A node that is not ``first_hand`` (not a seed), while no peer
        that delivered before holds the version, first tries one peer without standing among
        ``copies`` (peers that pushed it the verified head), or none while ``wait``, so a trainer's
        upload does not grow with the inference nodes."""
        s = self.standing
        ordered = s.providers(holders, quota=FETCH_UNKNOWN)
        if first_hand or (ordered and s.delivered_before(ordered[0].peer_id)):
            return ordered
        pushed = [p for p in holders if p.peer_id in copies and p.peer_id not in s.members and s.score(p.peer_id) >= 0]
        if not pushed:
            return [] if wait else ordered
        first = s.order(pushed, quota=1)[0]
        return [first] + [p for p in ordered if p.peer_id != first.peer_id]

    def view(self) -> PeerView:
        """What the transport's workers should know (``peers/view.py``)."""
        return PeerView(members=frozenset(self.standing.members), standing=tuple(self.standing.known_ids(VIEW_STANDING)))

    # ---- reports ----------------------------------------------------------------------------
    @property
    def strikes(self) -> Mapping[str, int]:
        return self.ledger.strikes

    @property
    def bans(self) -> Mapping[str, int]:
        return self.ledger.bans

    @property
    def rejected(self) -> int:
        """Strikes given, all peers together."""
        return self.ledger.rejected

    def convictions(self) -> list[Evidence]:
        """Every evidence this node holds, oldest first."""
        return self.evidence.entries()

    def summary(self) -> dict[str, int]:
        """Standing counts for the status page."""
        return self.standing.summary()


def _name(call: Callable[..., object]) -> str:
    """A boundary's name for ``call``: its function's qualified name, without ``<locals>`` parts."""
    func = getattr(call, "func", call)  # functools.partial
    name = getattr(func, "__qualname__", type(func).__name__)
    return name.split(".<locals>")[0]
