"""Where a trainer keeps the PULSELoCo files it serves: the payloads, round commitments and round
decisions of its last few rounds (``<root>/loco/<round>/``, see ``trainer/agreement.py``); what a
peer's request maps to is ``net/wire/serving.py``'s."""

from __future__ import annotations

from pathlib import Path

LOCO_DIR = "loco"


def loco_payload_path(root: Path, round: int, digest_hex: str) -> Path:
    """Where a trainer keeps a payload of a recent round, named by its BLAKE3 digest (hex)."""
    return Path(root) / LOCO_DIR / str(round) / f"{digest_hex}.payload"


def loco_decision_path(root: Path, round: int) -> Path:
    """Where a trainer keeps the signed decision of a recent round it accepted."""
    return Path(root) / LOCO_DIR / str(round) / "decision"


def loco_commit_path(root: Path, round: int, digest_hex: str) -> Path:
    """Where a trainer keeps a round commitment it holds, named by its BLAKE3 digest (hex): a
    decision names commitments by digest, and a member lacking one fetches it (``loco_commit``)."""
    return Path(root) / LOCO_DIR / str(round) / f"{digest_hex}.commit"
