"""Turning a failed spot check into evidence, and re-checking evidence someone else filed.

``accuse`` is the verifier's side: from a failed ``SpotVerdict`` (any reason but
``unanswered``) and what the target answered, the signed ``Accusation`` and its exhibits
(``loco/spot_evidence.py``). ``recheck`` is everyone else's: it checks both signatures (the
commitment's key and the accusation's key are the ones the target's and the accuser's peer ids
encode), takes each exhibit inline or by ``fetch`` (digest checked), and re-runs the very same
``SpotChecker.check`` on the round as this node holds it (``RoundBase``: every trainer of the
round holds its base). The outcome names who lied:

- ``CONFIRMED``: the re-check fails too; the target is the culprit (``Lied(evidence)`` for it);
- ``FALSE_ACCUSATION``: the exhibits show an honest round, clearly inside the tolerance
  (a tenth of it), or are not the target's (they do not verify against its commitment): the
  accuser signed a false claim and is the culprit;
- ``INCONCLUSIVE``: an exhibit cannot be had, this node does not hold the round's state, or the
  re-check passes only narrowly: nobody is convicted.

The peer book (``pulse_node/peers/``) turns a culprit into an outcome; this module only judges.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import blake3

from pulse_node.chain.identity import Identity, key_of_peer_id
from pulse_node.codec.state import State
from pulse_node.errors import PulseError
from pulse_node.loco.bound import max_payload_bytes
from pulse_node.loco.commit import decode_commitment, encode_commitment, verify_commitment
from pulse_node.loco.opening import decode_opening, encode_opening
from pulse_node.loco.payload import decode_payload
from pulse_node.loco.spot_evidence import Accusation, SpotEvidence, make_evidence, sign_accusation, verify_accusation
from pulse_node.loco.spotdraw import SpotDraw
from pulse_node.trainer.recompute import RoundBase, SpotCase, SpotChecker, SpotFailure, SpotUnavailable, SpotVerdict

ACQUIT_SHARE = 0.1  # a re-check convicts the accuser only if every statistic is within this share of its bound


class Recheck(str, enum.Enum):
    CONFIRMED = "confirmed"
    FALSE_ACCUSATION = "false_accusation"
    INCONCLUSIVE = "inconclusive"


@dataclass
class RecheckResult:
    outcome: Recheck
    culprit: str  # the key (hex) that lied: the target's if confirmed, the accuser's if false; "" if inconclusive
    detail: str
    verdict: SpotVerdict | None = None


def accuse(identity: Identity, *, accuser: str, run_id: str, verdict: SpotVerdict, case: SpotCase,
           payload_bytes: bytes) -> SpotEvidence:
    """The signed evidence of a failed check (``ValueError`` for a passed or unanswered one)."""
    if verdict.reason in (None, SpotFailure.UNANSWERED, SpotFailure.SETTINGS):
        raise ValueError("only a check that failed on the target's own data becomes evidence")
    exhibits = {"opening": encode_opening(case.opening), "payload": payload_bytes}
    exhibits.update({f"batch/{i}": b for i, b in enumerate(case.batches)})
    if case.patch is not None:
        exhibits["patch"] = case.patch
    if case.next_opening is not None:
        exhibits["next_opening"] = encode_opening(case.next_opening)
    c, draw = case.commitment, verdict.draw
    unsigned = Accusation(
        run_id=run_id, round=c.round, target=c.trainer, accuser=accuser, signer="", step=draw.step,
        leaves=draw.leaves, reason=verdict.reason.value, keep=case.keep, commitment=encode_commitment(c),
        next_commitment=encode_commitment(case.next_commitment) if case.next_commitment else b"",
        exhibits=tuple((n, blake3.blake3(b).digest()) for n, b in sorted(exhibits.items())))
    return make_evidence(sign_accusation(identity, unsigned), exhibits)


def _exhibit(ev: SpotEvidence, name: str, fetch: Callable[[bytes], bytes | None]) -> bytes | None:
    digest = ev.accusation.digest_of(name)
    if digest is None:
        return None
    data = ev.exhibits.get(digest)
    if data is None:
        data = fetch(digest)
    return data if data is not None and blake3.blake3(data).digest() == digest else None


class _Missing(Exception):
    pass


def _case(ev: SpotEvidence, checker: SpotChecker, base: RoundBase,
          fetch: Callable[[bytes], bytes | None], key_of: Callable[[str], str] = key_of_peer_id) -> SpotCase:
    """The target's answer as the exhibits carry it (``_Missing`` if one cannot be had; the
    target's signatures checked; ``PulseError`` if an exhibit is malformed)."""
    a = ev.accusation
    got = {n: _exhibit(ev, n, fetch) for n, _ in a.exhibits}
    if any(v is None for v in got.values()) or "opening" not in got or "payload" not in got:
        raise _Missing("an exhibit is neither carried nor fetched")
    c = decode_commitment(a.commitment)
    verify_commitment(c, signer_key=key_of(a.target))
    nxt = decode_commitment(a.next_commitment) if a.next_commitment else None
    if nxt is not None:
        verify_commitment(nxt, signer_key=key_of(a.target))
    payload = decode_payload(got["payload"] or b"", shapes=checker.shapes, base=base.fp32,
                             max_bytes=max_payload_bytes(checker.shapes, cap=checker.loco.max_payload_bytes))
    if blake3.blake3(got["payload"] or b"").digest() != c.payload or payload.trainer_id != c.trainer:
        raise PulseError("the payload exhibit is not the one the commitment stands behind")
    batches = [got[n] or b"" for n in sorted((n for n in got if n.startswith("batch/")), key=lambda n: int(n[6:]))]
    return SpotCase(c, decode_opening(got["opening"] or b""), batches, got.get("patch"), payload, a.keep, nxt,
                    decode_opening(got["next_opening"] or b"") if got.get("next_opening") else None)


def _acquits(v: SpotVerdict, checker: SpotChecker) -> bool:
    t = checker.tol
    return v.ok and v.gradient_error <= ACQUIT_SHARE * t.gradient and \
        max(v.weights_off, v.payload_off, v.link_off) <= ACQUIT_SHARE * t.share


def recheck(ev: SpotEvidence, *, checker: SpotChecker, base: RoundBase,
            fetch: Callable[[bytes], bytes | None] = lambda digest: None,
            state_of: Callable[[int], State | None] | None = None,
            key_of: Callable[[str], str] = key_of_peer_id) -> RecheckResult:
    """Re-run the accused check on this node (see the module docstring); ``state_of`` gives the BF16
    states of the versions the batches may be made on (default: the round's own only); ``key_of``
    the key a peer id speaks for (default: the key a libp2p peer id encodes)."""
    a = ev.accusation
    try:
        accuser_key = key_of(a.accuser)
        verify_accusation(a, signer_key=accuser_key)
        target_key = key_of(a.target)
    except (PulseError, ValueError) as exc:
        return RecheckResult(Recheck.INCONCLUSIVE, "", f"the accusation itself does not hold: {exc}")
    try:
        case = _case(ev, checker, base, fetch, key_of)
    except _Missing as exc:
        return RecheckResult(Recheck.INCONCLUSIVE, "", str(exc))
    except (PulseError, ValueError) as exc:  # exhibits that are not the target's: the accuser's doing
        return RecheckResult(Recheck.FALSE_ACCUSATION, accuser_key, f"exhibits do not hold: {exc}")
    c = case.commitment
    if a.step >= len(c.steps):
        return RecheckResult(Recheck.FALSE_ACCUSATION, accuser_key, f"round {c.round} has no step {a.step}")
    draw = SpotDraw(a.round, a.target, a.accuser, a.step, a.leaves)
    try:
        verdict = checker.check(draw, case, base, state_of=state_of)
    except SpotUnavailable as exc:
        return RecheckResult(Recheck.INCONCLUSIVE, "", f"cannot re-run here: {exc}")
    if verdict.reason in (SpotFailure.UNANSWERED, SpotFailure.SETTINGS):
        return RecheckResult(Recheck.FALSE_ACCUSATION, accuser_key, f"not evidence of a lie: {verdict.detail}",
                             verdict)
    if verdict.reason is not None:
        return RecheckResult(Recheck.CONFIRMED, target_key, f"{verdict.reason.value}: {verdict.detail}", verdict)
    if _acquits(verdict, checker):
        return RecheckResult(Recheck.FALSE_ACCUSATION, accuser_key, "the accused step re-runs honestly", verdict)
    return RecheckResult(Recheck.INCONCLUSIVE, "", "the step passes, but narrowly", verdict)
