"""What a DHT node stores of the ``peers`` dictionary: every preferred peer, at most a fixed
number of the others.

Anyone may store a validly signed record under a fresh key, and hivemind keeps every subkey of a
dictionary it is asked to store and serves the whole dictionary on every read: 1,000 fresh keys'
records made every read of every node move and deserialize ~1,000 entries from every replica
(issue 21, the 1,000-key Sybil flood: 0.4x the swarm's rate on two cores, the DHT worker and its
p2pd the busiest processes). ``CappedStorage`` replaces the node's storage and cache: the
subkeys of the node itself, of the trainer-set members and of the peers with standing the node
named (``NewcomerGate.prefer``) are always kept; of the others at most ``cap``, chosen by this
node's secret draw, redrawn every ``rotate_s`` (a key cannot be ground to win, and every newcomer
gets its turn as the records are refreshed). A newcomer arriving while the share is full replaces
the stored newcomer with the worst draw if its own draw is better, else it is refused. So what a
node stores, serves and reads back is bounded by the preferred peers plus ``cap``, however many
keys publish; 1 or 1,000 fresh keys cost it the same. A dictionary a peer sends is validated
subkey by subkey (``keep_valid_subkeys``): a newcomer this node would not store is dropped from
it, and the members' records beside it are kept.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID, Subkey
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord
from hivemind.utils.timed_storage import DHTExpiration

if TYPE_CHECKING:  # hivemind ships no types: these read as unchecked
    from hivemind.dht.node import DHTNode

#: records of peers neither preferred nor members a node stores per dictionary, at most
STORED_NEWCOMERS = 32
#: preferred peer ids (peers with standing) a node remembers, at most
MAX_PREFERRED = 1024
#: draws remembered per epoch, at most
MAX_DRAWS = 16384


class NewcomerGate:
    """Which subkeys a node keeps: preferred ones always, at most ``cap`` others by a secret draw."""

    def __init__(self, *, cap: int = STORED_NEWCOMERS, rotate_s: float = 60.0, salt: bytes | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cap, self.rotate_s, self.clock = cap, rotate_s, clock
        self.salt = salt if salt is not None else os.urandom(16)
        self.own: frozenset[str] = frozenset()
        self.members: frozenset[str] = frozenset()
        self.standing: frozenset[str] = frozenset()
        self.refused = 0
        self.evicted = 0
        self._draws: dict[Subkey, bytes] = {}  # this epoch's draws (a refusal costs no hash over the stored ones)
        self._epoch = -1

    def prefer(self, peer_ids: Iterable[str]) -> None:
        """The peers with standing the node named (kept whatever the newcomers do)."""
        self.standing = frozenset(list(peer_ids)[:MAX_PREFERRED])

    def preferred(self, subkey: Subkey) -> bool:
        return subkey in self.own or subkey in self.members or subkey in self.standing

    def draw(self, subkey: Subkey) -> bytes:
        """This node's draw of ``subkey`` in the current epoch (remembered for the epoch, at most
        ``MAX_DRAWS`` of them)."""
        epoch = int(self.clock() // self.rotate_s) if self.rotate_s > 0 else 0
        if epoch != self._epoch or len(self._draws) >= MAX_DRAWS:
            self._draws.clear()
            self._epoch = epoch
        found = self._draws.get(subkey)
        if found is None:
            found = self._draws[subkey] = hashlib.blake2b(repr(subkey).encode(), key=self.salt, digest_size=8,
                                                          person=epoch.to_bytes(8, "big")).digest()
        return found

    def admit(self, stored: DictionaryDHTValue, subkey: Subkey) -> bool:
        """Whether ``subkey`` may be stored in ``stored`` now (a refresh of a stored subkey always
        may); makes room by dropping the stored newcomer with the worst draw when ``subkey``'s is
        better."""
        worst = self._worst_beaten(stored, subkey)
        if worst is False:
            self.refused += 1
            return False
        if worst is not None:
            del stored[worst]
            self.evicted += 1
        return True

    def hopeless(self, stored: DictionaryDHTValue, subkey: Subkey) -> bool:
        """Whether ``admit`` would refuse ``subkey`` now, changing nothing: asked before a record's
        signature is checked, so a refused newcomer costs a hash, not a signature check."""
        return self._worst_beaten(stored, subkey) is False

    def _worst_beaten(self, stored: DictionaryDHTValue, subkey: Subkey) -> Subkey | bool | None:
        """None: room for ``subkey``; the stored newcomer it displaces; False: refused."""
        if self.preferred(subkey) or subkey in stored:
            return None
        newcomers = [k for k, _ in stored.items() if not self.preferred(k)]
        if len(newcomers) < self.cap:
            return None
        worst = max(newcomers, key=self.draw)
        return False if self.draw(subkey) >= self.draw(worst) else worst

    def trim(self, value: DictionaryDHTValue) -> DictionaryDHTValue:
        """A copy of a whole dictionary with its preferred subkeys and at most ``cap`` others, those
        with the best draws (a dictionary read from other nodes, cached whole)."""
        items = list(value.items())
        others = sorted((k for k, _ in items if not self.preferred(k)), key=self.draw)
        keep = set(others[:self.cap])
        if len(others) <= self.cap:
            return value
        out = DictionaryDHTValue()
        for k, (v, exp) in items:
            if self.preferred(k) or k in keep:
                out.store(k, v, exp)
        self.refused += len(others) - self.cap
        return out

    def stats(self) -> dict[str, int]:
        return {"refused": self.refused, "evicted": self.evicted, "cap": self.cap}


class CappedStorage(DHTLocalStorage):  # type: ignore[misc]  # hivemind ships no types
    """hivemind's local storage, each dictionary's subkeys admitted by a ``NewcomerGate``."""

    def __init__(self, gate: NewcomerGate) -> None:
        super().__init__()
        self.gate = gate

    def store(self, key: DHTID, value: object, expiration_time: DHTExpiration, subkey: Subkey | None = None) -> bool:
        if subkey is None and isinstance(value, DictionaryDHTValue):
            value = self.gate.trim(value)
        return bool(super().store(key, value, expiration_time, subkey=subkey))

    def store_subkey(self, key: DHTID, subkey: Subkey, value: bytes, expiration_time: DHTExpiration) -> bool:
        found = self.get(key)
        if found is not None and isinstance(found.value, DictionaryDHTValue) \
                and not self.gate.admit(found.value, subkey):
            return False
        return bool(super().store_subkey(key, subkey, value, expiration_time))


def refuse_before_signature(node: DHTNode, gate: NewcomerGate) -> Callable[[DHTRecord], bool]:
    """The validator's first check (``PulseRecordValidator.precheck``): True for a record of a
    dictionary this node holds (stored, else cached) that the gate would refuse anyway. A flood of
    fresh keys then costs each record a decode and a hash, not an Ed25519 verification (~150 us
    each: 1,000 keys cost every DHT worker ~12 CPU s per 20 s before this)."""
    proto = node.protocol

    def hopeless(record: DHTRecord) -> bool:
        key = DHTID.from_bytes(record.key)
        found = proto.storage.get(key) or proto.cache.get(key)
        if found is None or not isinstance(found.value, DictionaryDHTValue):
            return False
        try:
            subkey = DHTProtocol.serializer.loads(record.subkey)
        except Exception:  # not a subkey at all: the validator refuses it
            return False
        if not isinstance(subkey, str) or not gate.hopeless(found.value, subkey):
            return False
        gate.refused += 1
        return True

    return hopeless


def keep_valid_subkeys(proto: DHTProtocol) -> None:
    """Validate a dictionary a peer sends (a replica's answer, a store) subkey by subkey.

    hivemind's ``DHTProtocol._validate_dictionary`` refuses the whole dictionary when one subkey
    fails: once this node's newcomer share is full, its validator refuses every other newcomer
    (``refuse_before_signature``), so an answer carrying one of them was thrown away whole,
    members' fresh records included, and the node's view froze on its cache for a record's
    lifetime. Here each subkey this node refuses (a newcomer it would not store, a bad signature,
    an expiry too far ahead) is dropped from the dictionary, and the rest is kept."""
    serializer = DHTProtocol.serializer

    def per_subkey(key_bytes: bytes, dictionary: DictionaryDHTValue) -> bool:
        validator = proto.record_validator
        if validator is None:
            return True
        def valid(sub: Subkey, value: bytes, exp: DHTExpiration) -> bool:
            try:
                return bool(validator.validate(DHTRecord(key_bytes, serializer.dumps(sub), value, exp)))
            except Exception:
                return False

        with dictionary.freeze():
            refused = [sub for sub, (value, exp) in dictionary.items() if not valid(sub, value, exp)]
        for sub in refused:
            del dictionary[sub]
        return True

    proto._validate_dictionary = per_subkey


def cap_node_storage(node: DHTNode, gate: NewcomerGate) -> None:
    """Give a started hivemind ``DHTNode`` capped storage and cache (what it held is kept, through
    the gate), and dictionaries from peers validated subkey by subkey (``keep_valid_subkeys``)."""
    proto = node.protocol
    keep_valid_subkeys(proto)
    for attr in ("storage", "cache"):
        old, new = getattr(proto, attr), CappedStorage(gate)
        for key, item in list(old.items()):
            if isinstance(item.value, DictionaryDHTValue):
                for sub, (value, exp) in list(item.value.items()):
                    new.store_subkey(key, sub, value, exp)
            else:
                new.store(key, item.value, item.expiration_time)
        setattr(proto, attr, new)
