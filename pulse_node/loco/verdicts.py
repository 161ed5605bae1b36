"""The spot-check verdicts a round decision names, checked and turned into ledger facts (torch-free).

A decision (``loco/decision.py``) carries the signed ``CheckVerdict``s (``loco/commitlist.py``)
its coordinator held, and the keys their evidence convicts. Every trainer checks them before it
accepts the decision (``verdict_problems``): each verdict signed by its verifier, a member, for
this run and epoch, of a check of one of the last ``VERDICT_WINDOW`` rounds; a convicted key is
the target or the verifier of a failed verdict the decision names with evidence (the
coordinator's re-check of that evidence says which: ``trainer/spot_round.py``). So a
coordinator can invent no verdict and convict nobody without a drawn verifier's signed failure.
A failed verdict acts in the round whose decision names it (``failing``: its target's payload
does not count), one with evidence only if the decision convicts its target (``acting``); ``ledger_facts`` is what the ledger then applies (``loco/ledger.RoundFacts``), the same on every
trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from pulse_node.errors import PulseError
from pulse_node.loco.commitlist import VERDICTS, CheckVerdict
from pulse_node.loco.decision import RoundDecision
from pulse_node.loco.ledger import VERDICT_WINDOW, Ledger, Verdict


def named_verdicts(d: RoundDecision) -> list[CheckVerdict]:
    """The verdicts ``d`` names, decoded (``WireError`` if one is malformed; signatures unchecked)."""
    return [VERDICTS.decode(v) for v in d.verdicts]


def verdict_problems(d: RoundDecision, *, key_of: Callable[[str], str], is_member: Callable[[str], bool]) -> str | None:
    """Why the verdicts and convictions ``d`` names may not be taken (None: they may)."""
    try:
        verdicts = named_verdicts(d)
    except PulseError as exc:
        return f"round {d.round} decision names a malformed verdict: {exc}"
    seen: set[tuple[int, str, str]] = set()
    for v in verdicts:
        if (v.run_id, v.epoch) != (d.run_id, d.epoch) or not 0 < d.round - v.round <= VERDICT_WINDOW:
            return f"round {d.round} decision names a verdict of round {v.round} of another run, epoch or window"
        if v.key in seen or not is_member(v.verifier):
            return f"round {d.round} decision names a verdict twice, or one of {v.verifier[:12]}, no member"
        seen.add(v.key)
        try:
            VERDICTS.verify(v, signer_key=key_of(v.verifier), tag=f"verdict of {v.verifier[:12]} on {v.target[:12]}")
        except PulseError as exc:
            return str(exc)
    backed = {k for v in verdicts if v.evidence for k in (v.target, v.verifier)}
    if not set(d.convicted) <= backed:
        return f"round {d.round} decision convicts a key no failed verdict with evidence names"
    return None


def acting(verdicts: Iterable[CheckVerdict], *, convicted: Collection[str]) -> list[CheckVerdict]:
    """The verdicts among ``verdicts`` (a decision's) that act on their target: passes, "no answer",
    and a failure with evidence only where the decision convicts its target (``convicted``). A
    failure whose evidence convicts its accuser, or that nobody re-checked, costs its target nothing:
    one member's signed claim never keeps an honest key out."""
    return [v for v in verdicts if not v.evidence or v.target in convicted]


def failing(verdicts: Iterable[CheckVerdict], ledger: Ledger, *, convicted: Collection[str]) -> set[str]:
    """The targets of the failed verdicts among ``verdicts`` (a decision's, which convicts
    ``convicted``) that act (``acting``) and ``ledger`` has not applied yet: their payloads enter
    no payload of the decision's round (``loco/roundrules.entering``), as the byzantine harness's ``entered``."""
    return {v.target for v in acting(verdicts, convicted=convicted) if not v.passed and v.key not in ledger.applied}


def ledger_facts(d: RoundDecision) -> tuple[tuple[Verdict, ...], tuple[str, ...]]:
    """The verdicts and convictions of ``d`` as the ledger takes them (the verdicts that act,
    ``acting``): by round, a round's passes before its failures (a check failed in a round leaves
    its target owing, whatever another passed)."""
    named = acting(named_verdicts(d), convicted=d.convicted)
    verdicts = tuple(sorted((Verdict(v.round, v.target, v.verifier, v.passed) for v in named),
                            key=lambda v: (v.round, v.passed is False, v.target.encode(), v.verifier.encode())))
    return verdicts, tuple(d.convicted)
