"""Each version is verified once on its way from the trainer's publisher to an inference node.

Per version: one Ed25519 verification of its record, one BLAKE3 digest of a state and, where a
patch carries it, one parse of the patch header (none on the publisher, which keeps the header it
wrote). Counted by wrapping the functions themselves (``verify_signature``, ``state_hash``,
``unpack_header``) in every module that imported them, on the embedded tiny model, through the
real publisher, stores, trust gate and syncer over the in-memory transport: an anchor load, patches
(one of them an anchor version) and a catch-up patch. And: only the trust gate and the publisher
seal a ``VerifiedVersion``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pulse_node.chain.catchup_producer import CatchupProducer
from pulse_node.chain.identity import Identity, verify_signature
from pulse_node.chain.peer import PeerStatus, Serves
from pulse_node.chain.record import RECORD_MAGIC, VersionRecord
from pulse_node.chain.statement import DOMAIN
from pulse_node.chain.store import VersionStore
from pulse_node.chain.verified import VerifiedVersion
from pulse_node.codec.header import unpack_header
from pulse_node.codec.state import State
from pulse_node.codec.statehash import state_hash
from pulse_node.config import ChainConfig, NetConfig
from pulse_node.inference.syncer import VersionSync
from pulse_node.net.wire.serving import store_resolver
from pulse_node.peers.book import PeerBook
from pulse_node.peers.trainerset import TrainerSet
from pulse_node.rl.config import ModelConfig
from pulse_node.rl.policy import build_tiny
from pulse_node.testing.adversaries import peer_id
from pulse_node.testing.memory import MemoryHub, MemoryTransport
from pulse_node.torchbits import module_state
from pulse_node.trainer.publisher import VersionPublisher

RUN = "verify-once"
TRAINER = Identity.generate()


def _of_a_record(signed: bytes) -> bool:
    """Whether signed bytes are a version record's: the statements' domain, then the record's magic."""
    return signed.startswith(DOMAIN) and RECORD_MAGIC.encode() in signed[:len(DOMAIN) + 32]


class Counts:
    """Calls of the three checks, wherever they are imported in ``pulse_node``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n: Counter[str] = Counter()
        self._wrap(monkeypatch, verify_signature, "signature",
                   only=lambda key, data, sig: _of_a_record(bytes(data)))
        self._wrap(monkeypatch, state_hash, "state_hash")
        self._wrap(monkeypatch, unpack_header, "header")

    def _wrap(self, monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Any], label: str,
              only: Callable[..., bool] | None = None) -> None:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if only is None or only(*args, **kwargs):
                self.n[label] += 1
            return fn(*args, **kwargs)

        wrapped = 0
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("pulse_node") and getattr(mod, fn.__name__, None) is fn:
                monkeypatch.setattr(mod, fn.__name__, counted)
                wrapped += 1
        assert wrapped, f"nothing imports {fn.__name__}"

    def take(self) -> dict[str, int]:
        out = {k: self.n[k] for k in ("signature", "state_hash", "header")}
        self.n.clear()
        return out


def _tiny_states(n: int) -> list[State]:
    """BF16 states of the embedded tiny model, each a small random step from the previous one."""
    params = dict(build_tiny(ModelConfig(), seed=0, device=torch.device("cpu")).module.named_parameters())
    gen = torch.Generator().manual_seed(1)
    states = []
    with torch.no_grad():
        for _ in range(n):
            states.append(module_state(params.items()))
            for p in params.values():
                p.add_(torch.randn(p.shape, generator=gen) * 0.01 * (p.abs() + 1e-3))
    return states


class Trainer:
    """The real publisher on its own store, served on the hub under the trainer's peer id."""

    def __init__(self, root: Path, hub: MemoryHub) -> None:
        self.store = VersionStore(root)
        self.publisher = VersionPublisher(self.store, TRAINER, run_id=RUN, chain=ChainConfig(anchor_every=3))
        self.transport: MemoryTransport = hub.join(peer_id(TRAINER), store_resolver(root))

    def publish(self, state: State) -> VersionRecord:
        record = self.publisher.publish(state).record
        head = self.store.head()
        assert head is not None
        self.transport.publish(PeerStatus(role="trainer", version=head.version, node_key=TRAINER.public_key_hex,
                                          serves=Serves(lowest=self.store.lowest_served(), highest=head.version,
                                                        anchors=self.store.anchors())))
        return record


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Trainer, VersionSync, list[State]]:
    hub = MemoryHub()
    trainer = Trainer(tmp_path / "trainer", hub)
    me = Identity.generate()
    transport = hub.join(peer_id(me), lambda request: None)
    transport.publish(PeerStatus(role="inference", node_key=me.public_key_hex))
    book = PeerBook(TrainerSet(run_id=RUN, keys=[TRAINER.public_key_hex]))
    sync = VersionSync(VersionStore(tmp_path / "inference"), transport, book, net=NetConfig(), catchup_min_gap=0)
    yield trainer, sync, _tiny_states(12)
    sync.close()
    sync.store.close()
    trainer.store.close()


def test_each_version_is_verified_once_from_publish_to_apply(chain, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer, sync, states = chain
    counts = Counts(monkeypatch)
    hub_peers = sync.transport.peers

    def published(v: int) -> None:
        trainer.publish(states[v])
        assert counts.take() == {"signature": 1, "state_hash": 1, "header": 0}, f"publishing v{v}"

    for v in range(5):  # anchors at 0 and 3
        published(v)
    applied = sync.step(hub_peers())  # no state yet: anchor 3 (no patch), then patch 4
    assert sync.record is not None and sync.record.version == 4 and [r.version for r in applied] == [4]
    assert counts.take() == {"signature": 2, "state_hash": 2, "header": 1}, "anchor 3 + patch 4"

    for v in range(5, 8):  # 6 is an anchor version, stored as one by the inference node too
        published(v)
    applied = sync.step(hub_peers())
    assert [r.version for r in applied] == [5, 6, 7] and sync.store.anchors() == [3, 6]
    assert counts.take() == {"signature": 3, "state_hash": 3, "header": 3}, "patches 5, 6 (an anchor), 7"

    for v in range(8, 12):
        published(v)
    CatchupProducer(trainer.store.root, wait_s=60).request(7, 11)  # made by the serving peer, before counting
    counts.take()
    sync.recovery.catchup_min_gap = 4
    applied = sync.step(hub_peers())
    assert [r.version for r in applied] == [11] and sync.counters.catchups == 1
    assert counts.take() == {"signature": 1, "state_hash": 1, "header": 1}, "one catch-up patch 7 -> 11"
    assert sync.state is not None and state_hash(sync.state) == trainer.store.head().state_hash


def test_a_version_applied_while_it_arrives_is_verified_once_too(chain, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inference node's default path streams the next version (``inference/streaming.py``):
    its header is parsed once as it comes and its state hash fed as it is applied."""
    from pulse_node.codec.pipelined import StateHasher
    from pulse_node.inference.streaming import Pipeline

    trainer, sync, states = chain
    sync.pipeline = Pipeline()
    for v in range(5):
        trainer.publish(states[v])
    sync.step(sync.transport.peers())
    assert sync.record is not None and sync.record.version == 4
    counts = Counts(monkeypatch)
    monkeypatch.setattr(StateHasher, "hexdigest", _counted(StateHasher.hexdigest, counts, "state_hash"))
    for v in range(5, 8):
        trainer.publish(states[v])
    counts.take()
    streamed_before = sync.pipeline.counters.streamed
    applied = sync.step(sync.transport.peers())
    assert [r.version for r in applied] == [5, 6, 7]
    assert sync.pipeline.counters.streamed > streamed_before, "no version was streamed"
    assert counts.take() == {"signature": 3, "state_hash": 3, "header": 3}, "patches 5, 6 (an anchor), 7"


def _counted(fn: Callable[..., Any], counts: Counts, label: str) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts.n[label] += 1
        return fn(*args, **kwargs)
    return counted


def test_the_reference_codec_size_is_opt_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pulse_node.trainer.publisher as publisher

    sizes: list[int] = []
    real = publisher.reference_size
    monkeypatch.setattr(publisher, "reference_size", lambda a, b: sizes.append(1) or real(a, b))
    states = _tiny_states(3)
    with VersionStore(tmp_path / "off") as store:
        pub = VersionPublisher(store, TRAINER, run_id=RUN, chain=ChainConfig())
        assert [pub.publish(s).reference_bytes for s in states] == [None, None, None] and not sizes
    with VersionStore(tmp_path / "on") as store:
        pub = VersionPublisher(store, TRAINER, run_id=RUN, chain=ChainConfig(reference_size=True))
        got = [pub.publish(s).reference_bytes for s in states]
        assert got[0] is None and all(isinstance(b, int) and b > 0 for b in got[1:]) and len(sizes) == 2


def test_a_verified_version_is_made_only_by_the_gate_and_the_publisher() -> None:
    record = TRAINER.public_key_hex  # anything: the constructor refuses before looking at it
    with pytest.raises(TypeError, match="trust gate"):
        VerifiedVersion(record)  # type: ignore[arg-type]
    package = Path(__file__).resolve().parent.parent / "pulse_node"
    allowed = {"seal_checked": {"chain/gate.py", "chain/verified.py"},
               "sign_version": {"trainer/publisher.py", "chain/verified.py"},
               "seal_streamed": {"inference/streaming.py", "chain/verified.py"}}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        text = path.read_text()
        for name, where in allowed.items():
            if re.search(rf"\b{name}\b", text):
                assert rel in where, f"{rel} uses {name}: only {sorted(where)} may seal a VerifiedVersion"
