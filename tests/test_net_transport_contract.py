"""The ``Transport`` contract (``daemon/transport.py``), run on both implementations.

``memory``: two ``MemoryTransport``s on one hub. ``p2p``: two ``P2PTransport``s, each with its
real DHT and wire worker processes on 127.0.0.1 port 0, the second joining the first's DHT; both
are trainers, so ``loco`` pushes take the p2pd plane (through the spool above 1 MiB) and every
other kind the py-libp2p wire. One pair per implementation serves every test of this module; the
last test closes one side.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerRecord, PeerStatus, Serves
from pulse_node.daemon.transport import Transport
from pulse_node.errors import NotFound, PeerUnavailable, WireError
from pulse_node.net.wire import protocol as wp
from pulse_node.net.wire.serving import resolve, store_resolver
from pulse_node.vocab import FETCH_KINDS, PUSH_KINDS

pytestmark = pytest.mark.timeout(300)
MiB = 1 << 20
#: one file of every fetch kind, at the path ``chain/serving.py`` maps its params to
REQUESTS: list[wp.FetchRequest] = [
    wp.RecordRequest(version=2), wp.PatchRequest(version=2), wp.AnchorRequest(version=0, offset=0, length=3 * MiB),
    wp.CatchupRequest(base=0, target=2), wp.TrainerStateRequest(), wp.LocoPayloadRequest(round=1, digest="cd" * 32),
    wp.LocoDecisionRequest(round=1), wp.LocoCommitRequest(round=1, digest="ef" * 32),
]


@dataclass
class Pair:
    a: Transport
    b: Transport
    files: dict[str, bytes]
    key: str  # a's node key (a P2P record must announce the key its peer id encodes)


def _store(root: Path) -> dict[str, bytes]:
    assert {wp.kind_of(r) for r in REQUESTS} == set(FETCH_KINDS)
    files = {}
    for req in REQUESTS:
        kind = wp.kind_of(req)
        path = resolve(root, req)
        path.parent.mkdir(parents=True, exist_ok=True)
        files[kind] = os.urandom(3 * MiB if kind == "anchor" else 5000)
        path.write_bytes(files[kind])
    return files


def _memory(root: Path, tmp: Path) -> tuple[Transport, Transport]:
    from pulse_node.testing.memory import MemoryHub

    hub = MemoryHub()
    return hub.join("node-a", store_resolver(root)), hub.join("node-b", store_resolver(tmp / "b-store"))


def _p2p_config(tmp: Path, name: str, bootstrap: list[str]) -> Any:
    from pulse_node.config import TrainerConfig

    loopback = ["/ip4/127.0.0.1/tcp/0"]
    return TrainerConfig.model_validate({"data_dir": str(tmp / name), "net": {
        "bootstrap": bootstrap, "dht_listen": loopback, "wire_listen": loopback, "head_poll_s": 0.2}})


def _p2p(root: Path, tmp: Path) -> tuple[Transport, Transport]:
    from pulse_node.daemon.p2p import P2PTransport

    def create(name: str, store: Path, bootstrap: list[str]) -> P2PTransport:
        cfg = _p2p_config(tmp, name, bootstrap)
        return P2PTransport.create(cfg, Identity.load_or_create(tmp / name / "identity.key"), store)

    a = create("a", root, [])
    try:
        b = create("b", tmp / "b-store", a.dht.info().visible_maddrs[:1])
    except BaseException:
        a.close()
        raise
    return a, b


@pytest.fixture(scope="module", params=["memory", pytest.param("p2p", marks=pytest.mark.slow)])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp(request.param)
    files = _store(tmp / "a-store")
    (tmp / "b-store").mkdir()
    key = Identity.load_or_create(tmp / "a" / "identity.key").public_key_hex
    a, b = (_memory if request.param == "memory" else _p2p)(tmp / "a-store", tmp)
    try:
        a.publish(PeerStatus(role="trainer", version=3, chain_hash="ab" * 32, node_key=key,
                             serves=Serves(lowest=1, highest=3, anchors=[0])))
        b.publish(PeerStatus(role="trainer"))
        yield Pair(a, b, files, key)
    finally:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: t.close(), (a, b)))


def _seen(by: Transport, peer_id: str, ok: Callable[[PeerRecord], bool] = lambda p: True) -> PeerRecord:
    found: list[PeerRecord] = []
    wait_for(lambda: bool(found.extend(p for p in by.peers() if p.peer_id == peer_id and ok(p)) or found),
             timeout=30, interval=0.1, what=f"{peer_id[:16]} in peers()")
    return found[0]


def _events(of: Transport, want: int) -> list:
    got: list = []
    wait_for(lambda: got.extend(of.events(wait_s=0.2)) or len(got) >= want, timeout=30, what=f"{want} events")
    return got


def test_publish_makes_a_view_of_the_record_visible_to_peers(pair: Pair) -> None:
    seen = _seen(pair.b, pair.a.peer_id, lambda p: p.head == 3)
    assert (seen.role, seen.head, seen.lowest, seen.anchors, seen.chain_hash, seen.node_key) == \
        ("trainer", 3, 1, [0], "ab" * 32, pair.key)
    assert seen.version == 3 and seen.serves.highest == 3  # the record itself: one peer type
    other = _seen(pair.a, pair.b.peer_id)
    assert (other.head, other.lowest, other.version, other.state_hash, other.node_key) == (-1, -1, None, None, None)


def test_every_fetch_kind_arrives_whole_and_a_missing_file_is_not_found(pair: Pair, tmp_path: Path) -> None:
    peer = _seen(pair.b, pair.a.peer_id)
    for req in REQUESTS:
        kind = wp.kind_of(req)
        n = pair.b.fetch(peer, req, tmp_path / kind, timeout=30)
        assert n == len(pair.files[kind]) and (tmp_path / kind).read_bytes() == pair.files[kind], kind
    for missing in (wp.PatchRequest(version=99), wp.LocoDecisionRequest(round=7)):
        with pytest.raises(NotFound):
            pair.b.fetch(peer, missing, tmp_path / "missing", timeout=10)
    assert not (tmp_path / "missing").exists()


def test_every_push_kind_arrives_from_the_authenticated_sender(pair: Pair) -> None:
    peer = _seen(pair.a, pair.b.peer_id)
    bodies = {kind: kind.encode() * 100 for kind in PUSH_KINDS}
    bodies["loco"] = os.urandom(2 * MiB)  # above the spool threshold on the p2p transport
    for kind, body in bodies.items():
        pair.a.push(peer, kind, body, timeout=30)
    got = _events(pair.b, len(bodies))
    assert sorted((e.kind, e.data) for e in got) == sorted(bodies.items())
    assert {e.sender for e in got} == {pair.a.peer_id}


def test_a_kind_outside_the_vocabulary_is_refused_before_anything_is_sent(pair: Pair, tmp_path: Path) -> None:
    peer = _seen(pair.a, pair.b.peer_id)
    for old_name in ("rollout", "decision"):  # the wire's spellings before one vocabulary
        with pytest.raises(WireError, match="unknown push kind"):
            pair.a.push(peer, old_name, b"x", timeout=5)  # type: ignore[arg-type]
    with pytest.raises(WireError, match="not a fetch request"):  # a push frame is no fetch request
        pair.a.fetch(peer, wp.PushRequest(v=wp.WIRE_VERSION, kind="loco", size=1), tmp_path / "x",  # type: ignore[arg-type]
                     timeout=5)
    assert pair.b.events(wait_s=0.3) == []


def test_close_leaves_discovery_and_ends_delivery(pair: Pair) -> None:
    peer = _seen(pair.a, pair.b.peer_id)
    pair.b.close()
    wait_for(lambda: pair.b.peer_id not in {p.peer_id for p in pair.a.peers()}, timeout=30,
             what="the closed transport to leave discovery")
    with pytest.raises(PeerUnavailable):
        pair.a.push(peer, "head", b"h", timeout=3)
