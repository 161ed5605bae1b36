"""Record floods (issue 21, item 1): one attacker process stores validly signed peer records under
many fresh keys, each announcing a data-plane address that never answers (a loopback listener
that accepts connections and says nothing), role ``inference``, an attractive version, anchors,
and an ``updated_at`` as far in the future as the validators allow.

The attacker runs one hivemind DHT node (its own p2pd) whose record validator signs each fresh
key's record with that key, so every DHT node of the swarm stores them, exactly as a real
attacker would. ``python -m pulse_node.testing.attack record_flood ...`` (500 keys) and
``sybil_flood`` (1,000 keys) run it; ``bench/adversary.py`` measures what it costs the swarm.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pulse_node.chain.identity import Identity
from pulse_node.chain.peer import PeerRecord, Serves
from pulse_node.net.dht.records import CLOCK_SLACK_S, dht_key

if TYPE_CHECKING:
    from pulse_node.net.dht.validator import PulseRecordValidator
    from pulse_node.testing.attackers import Report

#: attack name -> fresh keys it floods with
FLOODS = {"record_flood": 500, "sybil_flood": 1000}
#: the attractive version the records announce (ahead of any real head of a short run)
BAIT_VERSION = 10**6
TTL_S = 60.0


class _Blackhole:
    """A loopback TCP listener that accepts and never answers (counts connections)."""

    def __init__(self) -> None:
        self.accepted = 0
        self._held: list[asyncio.StreamWriter] = []

    async def start(self, host: str) -> int:
        self.server = await asyncio.start_server(self._hold, host, 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _hold(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._held.append(writer)
        if len(self._held) > 4096:
            self._held.pop(0).close()

    def close(self) -> None:
        for w in self._held:
            w.close()
        self.server.close()


def _flood_validator(run_id: str, own: Identity, keys: list[Identity]) -> PulseRecordValidator:
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.validation import DHTRecord

    from pulse_node.net.dht.validator import PulseRecordValidator, peer_id_of, sign_envelope

    by_subkey = {DHTProtocol.serializer.dumps(peer_id_of(k)): k for k in keys}

    class FloodValidator(PulseRecordValidator):
        """Signs each fresh key's record with that key (what any holder of those keys can do)."""

        def sign_value(self, record: DHTRecord) -> bytes:
            key = by_subkey.get(record.subkey)
            return sign_envelope(record, key) if key is not None else super().sign_value(record)

    return FloodValidator(run_id, own)


def _record(ident: Identity, *, port: int, host: str, now: float) -> PeerRecord:
    from pulse_node.net.dht.validator import peer_id_of

    pid = peer_id_of(ident)
    return PeerRecord(role="inference", peer_id=pid, session=os.urandom(16).hex(), updated_at=now + CLOCK_SLACK_S - 5,
                      wire_maddrs=[f"/ip4/{host}/tcp/{port}/p2p/{pid}"], version=BAIT_VERSION,
                      serves=Serves(lowest=0, highest=BAIT_VERSION, anchors=[0, 5, 10, BAIT_VERSION]),
                      node_key=ident.public_key_hex)


async def flood(run_id: str, bootstrap: list[str], *, keys: int, seconds: float, host: str = "127.0.0.1",
                on_start: Callable[[], None] | None = None, stop: threading.Event | None = None,
                ttl_s: float = TTL_S, go: threading.Event | None = None) -> Report:
    """Store and keep refreshing ``keys`` hostile records (living ``ttl_s``, refreshed every third
    of it) for ``seconds`` (or until ``stop``), once ``go`` is set (at once without it); what it did."""
    from pulse_node.net.dht.config import DhtConfig
    from pulse_node.net.dht.join import connect_bootstrap, create_dht_node, start_daemon
    from pulse_node.net.dht.validator import libp2p_private_key

    t0 = time.monotonic()
    own = Identity.generate()
    fresh = [Identity.generate() for _ in range(keys)]
    made_s = time.monotonic() - t0
    hole = _Blackhole()
    port = await hole.start(host)
    with tempfile.TemporaryDirectory(prefix="pulse-flood-") as tmp:
        key_file = Path(tmp) / "p2pd.key"
        key_file.write_bytes(libp2p_private_key(own))
        p2p = await start_daemon(DhtConfig(run_id=run_id, initial_peers=bootstrap, host_maddrs=[f"/ip4/{host}/tcp/0"]),
                                 str(key_file))
    stored = rounds = 0
    try:
        await connect_bootstrap(p2p, bootstrap, timeout=30)
        node = await create_dht_node(p2p, _flood_validator(run_id, own, fresh), initial_peers=bootstrap,
                                     client_mode=False, timeout=30)
        key = dht_key(run_id, "peers")
        deadline = time.monotonic() + seconds
        if on_start is not None:
            on_start()
        while go is not None and not go.is_set() and not (stop is not None and stop.is_set()):
            await asyncio.sleep(0.1)
        try:
            while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                now = time.time()
                for i in range(0, keys, 100):
                    batch = fresh[i:i + 100]
                    recs = [_record(k, port=port, host=host, now=now) for k in batch]
                    ok = await node.store_many([key] * len(recs), [r.model_dump() for r in recs], now + ttl_s,
                                               subkeys=[r.peer_id for r in recs])
                    stored += sum(bool(v) for v in ok.values())
                rounds += 1
                until = time.monotonic() + max(0.5, min(ttl_s / 3, deadline - time.monotonic()))
                while time.monotonic() < until and not (stop is not None and stop.is_set()):
                    await asyncio.sleep(0.25)
        finally:
            await node.shutdown()
    finally:
        await p2p.shutdown()
        hole.close()
    return {"tried": f"{keys} fresh keys' peer records: silent loopback addresses, version {BAIT_VERSION}, "
                     f"anchors, updated_at {CLOCK_SLACK_S - 5:.0f} s ahead",
            "keys": keys, "keygen_s": round(made_s, 3), "stored": stored, "rounds": rounds,
            "connections_held": hole.accepted, "succeeded": False}


def run_flood(name: str, *, run_id: str, bootstrap: list[str], seconds: float, host: str = "127.0.0.1",
              on_start: Callable[[], None] | None = None) -> Report:
    return asyncio.run(flood(run_id, bootstrap, keys=FLOODS[name], seconds=seconds, host=host, on_start=on_start))
