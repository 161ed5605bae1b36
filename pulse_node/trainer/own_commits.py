"""Our own round commitments, kept across restarts: never two for one round of one chain.

Two different commitments one key signed for one (epoch, round, base) convict it
(``trainer/commits.py``). A trainer that restarts within a round it committed to, and re-syncs
onto the same base, makes a new payload; signing a commitment to it would convict it. So each
commitment we sign is kept durably in ``<data_dir>/committed/<epoch>/<round>`` (the last
``OWN_KEEP`` rounds of the current epoch; other epochs' folders are deleted) before it is pushed,
and a round we committed to before is committed to again with the same bytes: the payload made
now is then never revealed (it goes back into the error feedback) and the round goes on without
it. A fresh data directory forgets them, as it forgets our decisions (``trainer/decisions.py``).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from pulse_node.errors import PulseError
from pulse_node.fsutil import write_atomic
from pulse_node.loco.roundcommit import MAX_ROUNDCOMMIT_BYTES, RoundCommit, decode_commit

OWN_KEEP = 8  # rounds whose own commitment a trainer keeps on disk
log = logging.getLogger("pulse.node")


def _path(data_dir: Path, epoch: bytes, r: int) -> Path:
    return Path(data_dir) / "committed" / epoch.hex() / str(r)


def signed_before(data_dir: Path, *, epoch: bytes, r: int, base: bytes, signer: str) -> bytes | None:
    """The commitment of round ``r`` on ``base`` we signed earlier (before a restart, too), if any."""
    try:
        data = _path(data_dir, epoch, r).read_bytes()[:MAX_ROUNDCOMMIT_BYTES + 1]
        c: RoundCommit = decode_commit(data)
    except (OSError, PulseError):
        return None
    return data if (c.epoch, c.round, c.base, c.signer) == (epoch, r, base, signer) else None


def keep(data_dir: Path, *, epoch: bytes, r: int, data: bytes) -> None:
    """Keep our commitment of round ``r`` durably; forget old rounds and every other epoch's."""
    path = _path(data_dir, epoch, r)
    try:
        write_atomic(path, data)
        for old in path.parent.iterdir():
            if old.name.isdigit() and int(old.name) < r - OWN_KEEP:
                old.unlink(missing_ok=True)
        for other in path.parent.parent.iterdir():
            if other != path.parent:
                shutil.rmtree(other) if other.is_dir() else other.unlink()
    except OSError as exc:
        log.warning("cannot keep our commitment of round %d: %s", r, exc)
