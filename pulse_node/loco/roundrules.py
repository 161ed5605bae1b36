"""Which commit lists and decisions a trainer accepts: no dropping, no rushing (torch-free, pure).

A round's coordinator decides twice (``trainer/agreement.py``): a ``CommitList`` when the commit
phase closes (``loco/commitlist.py``), then a ``RoundDecision`` naming the revealed payloads of
that list. Every trainer checks both against what it holds itself, with the time each statement
arrived here (monotonic seconds) and a ``skew`` that covers the relay of a statement between two
honest trainers:

- **A list** must name every commitment this trainer held ``skew`` before the list arrived, as
  held (one key's other commitment is equivocation), unless its key is convicted here; every
  verdict it held as long; and call exactly the listed keys this trainer's peer book holds as
  members members. A commitment that arrived after this trainer accepted a list is late: it
  counts for nothing, so nobody can commit after seeing a revealed payload.
- **A decision** names its list's digest; its contributors are listed keys that entered the round
  (``entered``: members, open trainers with earned weight, and the newcomers the ledger's draw lets
  in, ``loco/ledger.py``), each with the payload digest its commitment names; it must name every
  such payload this trainer held ``skew`` before the decision arrived, unless it excludes the key
  as convicted; a key it excludes must be convicted here too (until it is, the decision waits).

``Problem.wait`` marks what may resolve itself (a conviction still travelling); anything else is
the coordinator's fault, and the next coordinator decides.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from pulse_node.loco.commitlist import CommitList
from pulse_node.loco.ledger import Ledger
from pulse_node.loco.roundcommit import commit_digest


@dataclass(frozen=True)
class Held:
    """A statement this trainer holds: its digest and when it arrived here (monotonic seconds)."""

    digest: bytes
    at: float


@dataclass(frozen=True)
class Problem:
    message: str
    wait: bool = False  # may resolve itself (a conviction still travelling): look again later


def in_time(h: Held, *, arrived: float, skew: float) -> bool:
    """Held long enough before a statement arrived that its coordinator must have held it too."""
    return h.at <= arrived - skew


def list_problems(lst: CommitList, *, commits: Mapping[str, Held], verdicts: Mapping[tuple[int, str, str], Held],
                  is_member: Callable[[str], bool], convicted: Callable[[str], bool], arrived: float,
                  skew: float) -> list[Problem]:
    """Why ``lst`` may not be accepted here (nothing: it may)."""
    named = {c: commit_digest(data) for c, data in zip((x.trainer for x in lst.listed().values()), lst.commits)}
    out = []
    for trainer, h in sorted(commits.items()):
        if convicted(trainer) or not in_time(h, arrived=arrived, skew=skew):
            continue
        if trainer not in named:
            out.append(Problem(f"round {lst.round} list of {lst.coordinator[:12]} leaves out the commitment of "
                               f"{trainer[:12]}"))
        elif named[trainer] != h.digest:
            out.append(Problem(f"round {lst.round} list names another commitment of {trainer[:12]} than ours"))
    listed_verdicts = {v.key for v in lst.checked()}
    for vkey, h in sorted(verdicts.items()):
        if vkey not in listed_verdicts and in_time(h, arrived=arrived, skew=skew):
            out.append(Problem(f"round {lst.round} list leaves out the verdict of {vkey[2][:12]} on {vkey[1][:12]}"))
    members = set(lst.members)
    out.extend(Problem(f"round {lst.round} list calls {key[:12]} {'a' if key in members else 'no'} member", wait=True)
               for key in sorted({*named, *(k[1] for k in listed_verdicts)}) if (key in members) != is_member(key))
    return out


def entered(lst: CommitList, ledger: Ledger) -> set[str]:
    """The listed keys whose payloads may count this round: members, open trainers past their
    newcomer rounds, and the newcomers the ledger's entry draw lets in (at most ``open_per_round``);
    never a key owing a check or convicted (``loco/ledger.py``), nor one failing a check this list
    names (the ledger applies that verdict only after the round's weights: a round sooner)."""
    members = set(lst.members)
    failed = {v.target for v in lst.checked() if not v.passed}
    listed = {k for k in lst.listed() if not (ledger.owing(k) or ledger.convicted(k)) and k not in failed}
    new = {k for k in listed if ledger.newcomer(k, member=k in members)}
    return (listed - new) | ledger.entrants(new)


def entering(keys: Iterable[str], *, is_member: Callable[[str], bool], ledger: Ledger,
             failed: Collection[str] = ()) -> set[str]:
    """The keys among ``keys`` (a decision's commitments) whose payloads may count in the real
    round (``trainer/agreement.py``): members, open trainers past their newcomer checks, and the
    newcomers the ledger's entry draw lets in; never a key owing a check or convicted, nor one of
    ``failed`` (failing a check the round's decision names, ``loco/verdicts.failing``: the ledger
    applies that verdict only after the round's weights, a round later)."""
    ks = {k for k in keys if not (ledger.owing(k) or ledger.convicted(k)) and k not in failed}
    new = {k for k in ks if not is_member(k) and ledger.newcomer(k, member=False)}
    return (ks - new) | ledger.entrants(new)


def open_priority(ledger: Ledger, key: str) -> tuple[int, bytes, bytes]:
    """Which open trainers' commitments a trainer keeps when more come than it holds
    (``trainer/commits.py``), lowest first: keys past their newcomer checks (or owing one), then
    newcomers in the ledger's entry draw order, convicted keys last. The same on every trainer of
    a round, so what members hold of a flood does not depend on the order it arrived in."""
    cls = 2 if ledger.convicted(key) else int(ledger.newcomer(key, member=False) and not ledger.owing(key))
    return cls, ledger.rank(key), key.encode()


def unrevealed(commitments: Iterable[str], *, contributors: Collection[str], members: Collection[str],
               ledger: Ledger, failed: Collection[str] = ()) -> tuple[str, ...]:
    """The keys of a decision's ``commitments`` that entered the round (``entering``, on the ledger
    before the round) yet are not among its ``contributors``: committed, never revealed in time.
    A key is a member if the decision or the ledger says so (every trainer classes keys alike)."""
    keys = list(commitments)

    def member(k: str) -> bool:
        e = ledger.entries.get(k)
        return k in members or (e is not None and e.member)

    ok = entering(keys, is_member=member, ledger=ledger, failed=failed)
    return tuple(sorted((k for k in keys if k in ok and k not in contributors), key=str.encode))


def decision_problems(contributors: Mapping[str, bytes], *, excluded: Collection[str], lst: CommitList,
                      ledger: Ledger, payloads: Mapping[str, Held], convicted: Callable[[str], bool],
                      arrived: float, skew: float) -> list[Problem]:
    """Why a decision naming ``contributors`` (trainer id -> payload digest) and ``excluded`` on
    ``lst`` may not be accepted here (nothing: it may)."""
    listed, ok = lst.listed(), entered(lst, ledger)
    out = []
    for trainer, digest in sorted(contributors.items()):
        c = listed.get(trainer)
        if c is None or trainer not in ok or c.payload != digest:
            out.append(Problem(f"round {lst.round} decision names a payload of {trainer[:12]} the list does not let in"))
        elif convicted(trainer):
            out.append(Problem(f"round {lst.round} decision names {trainer[:12]}, convicted here"))
    for trainer in sorted(excluded):
        if trainer not in listed:
            out.append(Problem(f"round {lst.round} decision excludes {trainer[:12]}, which its list does not name"))
        elif not convicted(trainer):
            out.append(Problem(f"round {lst.round} decision excludes {trainer[:12]}, not convicted here (yet)",
                               wait=True))
    for trainer in sorted(ok - set(contributors) - set(excluded)):
        h = payloads.get(trainer)
        if h is not None and h.digest == listed[trainer].payload and in_time(h, arrived=arrived, skew=skew) \
                and not convicted(trainer):
            out.append(Problem(f"round {lst.round} decision leaves out the revealed payload of {trainer[:12]}"))
    return out
