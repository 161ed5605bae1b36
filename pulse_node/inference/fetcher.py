"""Downloads an inference node makes from one peer, each capped before a byte is read.

``PeerFetch`` is what ``VersionSync`` (``inference/syncer.py``) and ``Recovery``
(``inference/recovery.py``) both fetch through: a record (at most ``MAX_RECORD_BYTES``, decoded,
the version it claims checked) or one file (at most what a signed record or our own state
allows). Bytes that are not what was asked for raise ``IntegrityError``: the peer's lie, which
whoever asked hands to the peer book (``PeerBook.ask``); a download that fails otherwise raises
the transport's ``PulseError``. A peer without standing gets ``FIRST_TRY_S`` for a record, the
others the configured timeout. Every file lands in a scratch directory and is gone afterwards.
"""

from __future__ import annotations

import random
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import MAX_RECORD_BYTES, VersionRecord, decode_record
from pulse_node.config import NetConfig
from pulse_node.daemon.transport import Transport
from pulse_node.errors import IntegrityError, WireError
from pulse_node.net.wire.protocol import FetchRequest, RecordRequest, kind_of
from pulse_node.peers.book import PeerBook

#: seconds a peer without standing gets to send a record, when tried before the trainers
FIRST_TRY_S = 3.0


class PeerFetch:
    """Bounded downloads from peers into a scratch directory of our own."""

    def __init__(self, transport: Transport, book: PeerBook, *, net: NetConfig, scratch: Path) -> None:
        self.transport, self.book, self.net = transport, book, net
        self.scratch = _fresh_dir(scratch)

    def first_try(self, peer_id: str) -> float | None:
        """The record timeout for ``peer_id``: short for a peer without standing (a silent
        newcomer costs ``FIRST_TRY_S``, once), the configured one otherwise."""
        return None if self.book.known(peer_id) else FIRST_TRY_S

    def record(self, peer: PeerRecord, version: int) -> VersionRecord:
        """The record of ``version`` from ``peer``, decoded (not verified); ``IntegrityError`` (its
        lie) if it is no record of that version."""
        data = self.file(peer, RecordRequest(version=version), max_bytes=MAX_RECORD_BYTES,
                         timeout=self.first_try(peer.peer_id))
        try:
            rec = decode_record(data)
        except WireError as exc:  # it answered, with something that is no record: a lie, not a failure
            raise IntegrityError(f"version {version} from {peer.peer_id[:12]}: {exc}") from None
        if rec.version != version:
            raise IntegrityError(f"asked for version {version}, got record of {rec.version}")
        return rec

    def file(self, peer: PeerRecord, request: FetchRequest, *, max_bytes: int, timeout: float | None = None) -> bytes:
        """One file, refused (``IntegrityError``: the peer's lie) if it declares more than ``max_bytes``."""
        dest = self.path(kind_of(request))
        limit = self.net.fetch_timeout_s if timeout is None else min(timeout, self.net.fetch_timeout_s)
        with scratch_file(dest):
            self.transport.fetch(peer, request, dest, timeout=limit, max_bytes=max_bytes)
            return dest.read_bytes()

    def path(self, kind: str) -> Path:
        """A fresh file name in the scratch directory (fetches run on several threads)."""
        return self.scratch / f"{kind}-{threading.get_ident()}-{random.getrandbits(32):08x}"

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


@contextmanager
def scratch_file(dest: Path) -> Iterator[None]:
    """A download into ``dest``, gone afterwards whatever happened."""
    try:
        yield
    finally:
        dest.unlink(missing_ok=True)


def _fresh_dir(path: Path) -> Path:
    """An empty scratch directory (leftovers of a crashed fetch are removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
