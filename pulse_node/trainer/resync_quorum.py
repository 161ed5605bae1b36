"""Whose state a trainer may re-sync to: one a quorum of the trainer set signed, never one member's.

A re-sync replaces a trainer's whole state (``trainer/role.py`` ``_resync``), so one member must
not be able to trigger it nor choose what is adopted. The ballots for a version are the state
hashes of the signed records members published for it: the heads they pushed to us, else the
record each live member trainer serves for it (fetched and verified; one that holds an older
version votes for none, one that holds none yet does not vote), and our own if we hold the
version. Each key votes once (a key signing two records on one parent is convicted of
equivocation by the peer book instead, ``chain/gate.py``).

**The rule** (``majority``): ballots count by class, not by key. Only the shallowest class that
voted counts: the roots (configured keys) if any root voted, else the members the roots
admitted, and so on (``PeerBook.depth``). Within it, the state more than half of its voters hold
wins; when we are one of exactly two voters of that class in a tie, the lower peer id breaks it
(the only repair a two-trainer swarm has), never otherwise. So admitted keys, however many,
never outvote the roots, and keys admitted by admitted members never outvote those the roots
admitted: a Sybil majority wins neither the fork check nor the re-sync vote.

So a member's head conflicting with our own published head is no reason to re-sync unless the
others of its class side with it; a trainer behind adopts a state only if a majority of the
live members of the deciding class hold it, so one member announcing (and serving) a far
version is never adopted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from pulse_node.chain.identity import peer_id_of_key
from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import MAX_RECORD_BYTES, decode_record
from pulse_node.daemon.transport import Fetch
from pulse_node.errors import IntegrityError, PulseError
from pulse_node.net.wire.protocol import RecordRequest
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Fault

MAX_ASKED = 16  # member trainers asked for their record of a version, at most


def majority(ballots: Mapping[str, str], *, me: str = "",
             depth: Callable[[str], int | None] = lambda key: 0) -> str | None:
    """The state hash more than half of the shallowest class's ``ballots`` (voter key -> state
    hash; ``depth``: a voter's class, None: no vote) hold; with two voters of that class in a
    tie, one of them ``me``, the lower peer id's; else None (module docstring)."""
    classes = {k: d for k in ballots if (d := depth(k)) is not None}
    if not classes:
        return None
    top = min(classes.values())
    ballots = {k: h for k, h in ballots.items() if classes.get(k) == top}
    counts: dict[str, int] = {}
    for h in ballots.values():
        counts[h] = counts.get(h, 0) + 1
    for h, n in counts.items():
        if h and 2 * n > len(ballots):
            return h
    if len(ballots) == 2 and me in ballots:
        return ballots[min(ballots, key=lambda k: peer_id_of_key(k).encode())] or None
    return None


def gather_ballots(*, version: int, heads: Mapping[str, str], trainers: list[PeerRecord], book: PeerBook,
                   fetch: Fetch, scratch: Path, timeout: float, source: str = "") -> dict[str, str]:
    """Ballots for ``version`` of the live member ``trainers`` (key -> state hash; "" for one that
    does not hold the version): a pushed head (``heads``: key -> state hash) counts as its
    signer's ballot; a member without one is asked for its record of the version
    (``fetch(peer, RecordRequest(version=...), dest, ...)``, verified by the gate, a false one judged by ``book``). The record of ``source``
    (a peer id: the state we would adopt) is always asked for, and a failure there raises."""
    ballots = {k: h for k, h in heads.items() if book.is_member(k)}
    asked = 0
    for peer in trainers:
        key = book.key_of(peer.peer_id)
        if peer.peer_id == source:
            ballots[key] = _served_state(peer, version, book=book, fetch=fetch, scratch=scratch,
                                         timeout=timeout, strict=True)
            continue
        if not book.is_member(key) or key in ballots:
            continue
        if peer.head < 0:  # starting itself: no state to vote with (genesis, a fresh trainer)
            continue
        if peer.head < version or asked >= MAX_ASKED:
            ballots[key] = ""
            continue
        asked += 1
        ballots[key] = _served_state(peer, version, book=book, fetch=fetch, scratch=scratch, timeout=timeout)
    return ballots


def _served_state(peer: PeerRecord, version: int, *, book: PeerBook, fetch: Fetch, scratch: Path, timeout: float,
                  strict: bool = False) -> str:
    """The state hash of the verified record ``peer`` serves for ``version`` ("" if none; with
    ``strict`` the ``PulseError`` saying why)."""
    dest = scratch / f".ballot-{peer.peer_id[-16:]}"
    try:
        fetch(peer, RecordRequest(version=version), dest, timeout=timeout, max_bytes=MAX_RECORD_BYTES)
        rec = decode_record(dest.read_bytes()[:MAX_RECORD_BYTES + 1])
    except (PulseError, OSError):
        if strict:
            raise
        return ""
    finally:
        dest.unlink(missing_ok=True)
    verified = book.ask(peer.peer_id, lambda: book.gate.verify(rec))  # a record no member signed: its lie
    if isinstance(verified, Fault):
        if strict:
            raise IntegrityError(verified.why)
        return ""
    return rec.state_hash if rec.version == version else ""
