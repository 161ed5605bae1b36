"""Trainer side of PULSESync: turn each new global BF16 state into a signed version.

A version is a patch from the previous version (compact by default), a signed record naming
its parent chain hash, state hash and patch digest, and every ``anchor_every`` versions a full
anchor. Everything lands in the node's ``VersionStore``, which the wire worker serves.

Per version the state is hashed once, the patch header is the one ``encode_patch`` wrote (never
parsed back) and the new signature is verified once (``chain.verified.sign_version``: the
``VerifiedVersion`` the store takes). The reference codec's size for the same change is an
opt-in metric (``chain.reference_size``, off by default; ``bench/reference_size.py`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pulse_node.chain.anchor import anchor_manifest
from pulse_node.chain.identity import Identity
from pulse_node.chain.record import VersionRecord
from pulse_node.chain.store import VersionStore
from pulse_node.chain.verified import sign_version
from pulse_node.codec.header import FORMAT_VERSION
from pulse_node.codec.patch import encode_patch
from pulse_node.codec.reference_size import reference_size
from pulse_node.codec.state import State, state_nbytes
from pulse_node.codec.statehash import state_hash
from pulse_node.config import ChainConfig


@dataclass
class Published:
    """What one publication produced (for logs, metrics and the swarm summary)."""

    record: VersionRecord
    patch_bytes: int
    dense_bytes: int
    changed_fraction: float
    #: bytes the reference codec (grail v3.1) takes for the same change (None for the genesis anchor,
    #: and unless ``chain.reference_size``)
    reference_bytes: int | None = None


class VersionPublisher:
    """Publishes consecutive versions of one run into a store."""

    def __init__(self, store: VersionStore, identity: Identity, *, run_id: str, chain: ChainConfig,
                 rollout_settings: str = "") -> None:
        self.store = store
        self.identity = identity
        self.run_id = run_id
        self.chain = chain
        self.rollout_settings = rollout_settings  # declared in every record (rl/settings.py)
        self.head: VersionRecord | None = None
        self._state: State | None = None
        self.head, self._state = store.load_head() or (None, None)

    @property
    def state(self) -> State | None:
        return self._state

    def adopt(self, record: VersionRecord, state: State) -> None:
        """Continue from a version obtained elsewhere (re-sync from a peer)."""
        self.head, self._state = record, state

    def publish(self, state: State) -> Published:
        """Make the next version from ``state`` (version 0 is a genesis anchor)."""
        digest = state_hash(state)  # the one hash of this state
        if self.head is None or self._state is None:
            genesis = sign_version(self.identity, run_id=self.run_id, parent=None, state=state, state_hash=digest,
                                   patch=None, anchor_version=0, is_anchor=True, codec="anchor/safetensors",
                                   anchor_manifest=anchor_manifest(state), rollout_settings=self.rollout_settings)
            self.store.put_anchor(genesis)
            self.head, self._state = genesis.record, state
            return Published(genesis.record, 0, state_nbytes(state), 1.0)
        version = self.head.version + 1
        is_anchor = version % self.chain.anchor_every == 0
        patch = encode_patch(self._state, state, mode=self.chain.patch_mode, base_hash=self.head.state_hash,
                             new_hash=digest, position_context=self.chain.position_context)
        made = sign_version(self.identity, run_id=self.run_id, parent=self.head, state=state, state_hash=digest,
                            patch=patch, anchor_version=version if is_anchor else self.head.anchor_version,
                            is_anchor=is_anchor, codec=f"pulsesync/{self.chain.patch_mode}/{FORMAT_VERSION}",
                            anchor_manifest=anchor_manifest(state) if is_anchor else b"",
                            rollout_settings=self.rollout_settings)
        self.store.put_patch(made)
        if is_anchor:
            self.store.put_anchor(made)
        self.store.retain(keep_versions=self.chain.keep_versions, keep_anchors=self.chain.keep_anchors)
        changed = _changed_fraction(self._state, state)
        reference = reference_size(self._state, state) if self.chain.reference_size else None
        self.head, self._state = made.record, state
        return Published(made.record, len(patch), state_nbytes(state), changed, reference)


def _changed_fraction(old: State, new: State) -> float:
    changed = sum(int((old[k].bits != new[k].bits).sum()) for k in new)
    total = sum(t.numel for t in new.values())
    return changed / max(total, 1)
