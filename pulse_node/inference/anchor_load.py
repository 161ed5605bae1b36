"""Download one anchor (a full checkpoint) bounded by its signed record, blaming whoever lies.

The record of an anchor version names its file's manifest (``chain/anchor.py``). ``load_anchor``
fetches the file's header from one provider (at most ``MAX_HEADER_BYTES``) and checks it against
the manifest and the record, then downloads the rest from up to ``MAX_PROVIDERS`` peers at once
(``Transport.fetch_anchor``), each signed piece checked as it arrives: a provider that sends a
bad header or a bad piece is judged a liar by the peer book (and dropped from the download),
honest ones are not (the primary's bad header raises ``IntegrityError`` to the caller, who asked
it). Strikes
are bound to the record: the primary served it; every other provider is asked for its own record
of the version first and downloads from it only if that is the same record (chain hash and
manifest), so a member signing a second record for an anchor cannot get the pieces of providers
holding the real one struck; a provider answering with no record of the version, or one no member
signed, is struck. Nothing larger than the signed size is ever written. An anchor whose record carries no manifest is not
downloaded at all (its size would be whatever a provider says).

The signed size itself is bounded before a byte of data is fetched: the manifest's ``data_bytes``
must be exactly what the checked header's layout tiles (each tensor ``numel x its dtype's size``,
back to back), at most the dense size of the state this node holds (an anchor of the same model),
and at most what this machine has free on disk and in memory (a node without a state yet).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from pulse_node.chain.anchor import MAX_HEADER_BYTES, AnchorManifest, check_header, header_length, pieces, split_header
from pulse_node.chain.gate import SignedWrong
from pulse_node.chain.layout import state_metadata
from pulse_node.chain.peer import PeerRecord
from pulse_node.chain.record import MAX_RECORD_BYTES, VersionRecord, decode_record
from pulse_node.chain.verified import VerifiedVersion
from pulse_node.codec.state import DTYPES, load_safetensors
from pulse_node.daemon.transport import Transport
from pulse_node.errors import IntegrityError, PatchError, PulseError, WireError
from pulse_node.net.wire.protocol import AnchorRequest, RecordRequest
from pulse_node.peers.book import PeerBook
from pulse_node.peers.outcomes import Lied

#: first read of an anchor: the header of any model up to a few thousand tensors
HEADER_PROBE_BYTES = 64 << 10
MAX_PROVIDERS = 8


def fetch_header(transport: Transport, peer: PeerRecord, record: VersionRecord, scratch: Path, *,
                 timeout: float) -> bytes:
    """The anchor file's first ``8 + header`` bytes from ``peer``, checked against ``record``."""
    manifest = record.manifest()
    assert manifest is not None
    data = _range(transport, peer, record.version, HEADER_PROBE_BYTES, scratch, timeout=timeout)
    n = 8 + header_length(data[:8])
    if len(data) < n:
        data = _range(transport, peer, record.version, min(n, 8 + MAX_HEADER_BYTES), scratch, timeout=timeout)
    check_header(data[:n], manifest=manifest, metadata=state_metadata(record))
    check_layout_size(data[:n], manifest)
    return data[:n]


def check_layout_size(header: bytes, manifest: AnchorManifest) -> None:
    """``IntegrityError`` unless the header's tensors tile exactly the manifest's ``data_bytes``
    (each ``numel x its dtype's size``, back to back): the signed size is the layout's, no more."""
    _, parsed = split_header(header)
    spans = []
    for name, info in parsed.items():
        if name == "__metadata__":
            continue
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPES or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape) \
                or not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise IntegrityError(f"anchor header entry {str(name)[:64]!r} is malformed")
        numel = 1
        for d in shape:
            numel *= d
        if offsets[1] - offsets[0] != numel * DTYPES[dtype].itemsize:
            raise IntegrityError(f"anchor tensor {str(name)[:64]!r}: offsets do not match its shape and dtype")
        spans.append((offsets[0], offsets[1]))
    end = 0
    for lo, hi in sorted(spans):
        if lo != end:
            raise IntegrityError("anchor header tensors do not tile the data region")
        end = hi
    if end != manifest.data_bytes:
        raise IntegrityError(f"anchor manifest signs {manifest.data_bytes} data bytes, its layout holds {end}")


def anchor_room(scratch: Path, dense_bytes: int | None) -> int:
    """The largest anchor data region this node takes: the dense size of the state it holds (the
    same model), else what the machine has free on disk beside ``scratch`` and in memory."""
    if dense_bytes is not None:
        return dense_bytes
    return min(shutil.disk_usage(scratch).free, psutil.virtual_memory().available)


def _range(transport: Transport, peer: PeerRecord, version: int, length: int, scratch: Path, *,
           timeout: float) -> bytes:
    dest = scratch / f"anchor-{version}.head"
    try:
        transport.fetch(peer, AnchorRequest(version=version, offset=0, length=length), dest,
                        timeout=timeout, max_bytes=length)
        return dest.read_bytes()
    finally:
        dest.unlink(missing_ok=True)


def _serves(transport: Transport, book: PeerBook, peer: PeerRecord, record: VersionRecord, scratch: Path, *,
            timeout: float) -> bool:
    """Whether ``peer`` serves exactly ``record`` for its version (same chain hash and manifest).

    A peer that does not answer is only not asked; one that answers with something that is no
    record of that version, or with a record no member signed, is struck (it announced the anchor
    and lied about it); one relaying a member's other signed record for the version is not (the
    version gate's evidence convicts that member of equivocation instead)."""
    dest = scratch / f"anchor-{record.version}-{peer.peer_id[-16:]}.record"
    try:
        transport.fetch(peer, RecordRequest(version=record.version), dest, timeout=timeout, max_bytes=MAX_RECORD_BYTES)
        data = dest.read_bytes()[:MAX_RECORD_BYTES + 1]
    except (PulseError, OSError):
        return False
    finally:
        dest.unlink(missing_ok=True)
    try:
        theirs = decode_record(data)
    except WireError as exc:
        book.judge(peer.peer_id, Lied(f"no record of anchor {record.version}: {exc}"))
        return False
    if theirs.version != record.version:
        book.judge(peer.peer_id, Lied(f"record of {theirs.version} for anchor {record.version}"))
        return False
    if (theirs.chain_hash, theirs.anchor_manifest) == (record.chain_hash, record.anchor_manifest):
        return True
    book.ask(peer.peer_id, lambda: book.gate.verify(theirs))  # a record no member signed is its lie
    return False


def load_anchor(transport: Transport, book: PeerBook, record: VersionRecord, primary: PeerRecord,
                holders: list[PeerRecord], scratch: Path, *, timeout: float,
                dense_bytes: int | None = None) -> VerifiedVersion:
    """Anchor ``record`` (already verified: a member signed it for this run) with its state, hashed
    once by the version gate (``VersionGate.admit``): what ``VersionStore.put_anchor`` takes.

    ``primary`` serves the header; it and ``holders`` (peers announcing the anchor) serve pieces.
    ``dense_bytes``: the dense size of the state this node holds, if any (``anchor_room``).
    ``IntegrityError`` (the primary's lie: a bad header), ``SignedWrong`` (what the member signed
    is wrong: no manifest, or a state matching the manifest but not the signed state hash; no
    provider lied) or another ``PulseError`` if it cannot be had; other providers that lied are
    judged here."""
    manifest = record.manifest()
    if manifest is None:
        raise SignedWrong(f"anchor {record.short()} carries no manifest; its size is not bound by a signature")
    room = anchor_room(scratch, dense_bytes)
    if manifest.data_bytes > room:
        raise PatchError(f"anchor {record.short()} signs {manifest.data_bytes} data bytes; this node takes at "
                         f"most {room} (its model's dense size, else its free disk and memory)")
    header = fetch_header(transport, primary, record, scratch, timeout=min(timeout, 30.0))
    others = [p for p in holders if p.peer_id != primary.peer_id][:MAX_PROVIDERS - 1]
    providers = [primary, *[p for p in others if _serves(transport, book, p, record, scratch,
                                                          timeout=min(timeout, 10.0))]]
    dest = scratch / f"anchor-{record.version}.safetensors"
    try:
        result = transport.fetch_anchor(providers, version=record.version, pieces=pieces(header, manifest),
                                        dest=dest, timeout=timeout)
        for liar in result.bad_peers:
            book.judge(liar, Lied(f"a piece of anchor {record.version} failing its signed digest"))
        if result.error:
            raise WireError(result.error)
        state = load_safetensors(dest)
    finally:
        dest.unlink(missing_ok=True)
    try:  # the record was verified by ``check``: no signature again, one hash of the state
        return book.gate.admit(record, state=state)
    except IntegrityError as exc:  # every piece matched: the signer's manifest is wrong, no provider
        raise SignedWrong(f"anchor {record.short()} matches its manifest but not its state hash ({exc})") from None
