"""A trainer's full PULSELoCo state as a file peers can fetch: how trainers join and re-sync.

``trainer/state.safetensors`` in the store root holds the FP32 global weights
(``param/<name>``) and the outer momentum (``momentum/<name>``) after a round, with the
signed version record of that round, the trust ledger (``loco/ledger.py``) and the hash of
(round, weights, momentum, ledger) (the base the next round's payloads name) in its metadata. A trainer that starts late, restarts, or finds
its state hash disagreeing with a lower-id trainer fetches this file from a trainer-set member
(at most ``trainer_state_cap`` bytes: its own model's FP32 weights and momentum plus a header),
checks that ``bf16(params)`` hashes to the record's state hash and that the FP32 weights and
momentum hash to the outer hash, then (``TrainerRole``) that a member signed the record for this
run and that it is not older than its own state, and adopts it. Written atomically after every
version.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from pulse_node.chain.anchor import MAX_HEADER_BYTES
from pulse_node.chain.record import VersionRecord, decode_record, encode_record
from pulse_node.codec.state import State, load_safetensors, save_safetensors_atomic
from pulse_node.errors import IntegrityError, WireError
from pulse_node.loco.config import TrustConfig
from pulse_node.loco.hashing import outer_hash as hash_outer
from pulse_node.loco.ledger import Ledger
from pulse_node.loco.outer import OuterState
from pulse_node.torchbits import bits_to_tensor, tensor_to_bits

RELATIVE_PATH = Path("trainer") / "state.safetensors"


def trainer_state_cap(params: Mapping[str, torch.Tensor]) -> int:
    """The largest trainer state file of this model: FP32 weights and momentum, and a header (the ledger is in it)."""
    return 2 * 4 * sum(t.numel() for t in params.values()) + 8 + MAX_HEADER_BYTES


def export_trainer_state(root: Path, *, params: Mapping[str, torch.Tensor],
                         momentum: Mapping[str, torch.Tensor], record: VersionRecord, ledger: Ledger,
                         outer_hash: bytes | None = None) -> Path:
    """Write the state after ``record``'s round atomically; returns the file path.

    ``outer_hash``: ``loco.hashing.outer_hash`` of (round = record.version, params, momentum,
    ledger) if the caller has it (computed here otherwise)."""
    outer_hash = outer_hash or hash_outer(params, momentum, round=record.version, ledger=ledger.digest())
    state: State = {f"param/{n}": tensor_to_bits(t) for n, t in params.items()}
    state.update({f"momentum/{n}": tensor_to_bits(t) for n, t in momentum.items()})
    path = Path(root) / RELATIVE_PATH
    save_safetensors_atomic(state, path, metadata={"pulse.record": encode_record(record).hex(),
                                                   "pulse.outer_hash": outer_hash.hex(),
                                                   "pulse.ledger": ledger.encode().hex()})
    return path


def read_trainer_state(path: Path, *, names: set[str], trust: TrustConfig) -> tuple[OuterState, VersionRecord]:
    """Parse a fetched trainer state (hostile input); checks tensor names, the ledger's format
    (``trust``: its bounds) and the outer hash of weights, momentum and ledger. That
    bf16(params) is the record's state is the trust gate's check, made once where the re-sync
    admits the version (``VersionGate.admit``)."""
    from safetensors import safe_open  # metadata only; tensors come through codec.state

    try:
        with safe_open(str(path), framework="numpy") as fh:
            meta = fh.metadata() or {}
        record = decode_record(bytes.fromhex(meta["pulse.record"]))
        outer_hash = bytes.fromhex(meta["pulse.outer_hash"])
        ledger_bytes = bytes.fromhex(meta["pulse.ledger"])
    except WireError:
        raise
    except Exception as exc:  # safetensors raises its own error type on a malformed header
        raise WireError(f"{path}: not a trainer state file ({type(exc).__name__}: {exc})") from None
    state = load_safetensors(path)
    params = {k.split("/", 1)[1]: bits_to_tensor(v) for k, v in state.items() if k.startswith("param/")}
    momentum = {k.split("/", 1)[1]: bits_to_tensor(v) for k, v in state.items() if k.startswith("momentum/")}
    if set(params) != names or set(momentum) != names:
        raise WireError(f"{path}: trainer state does not match this model's tensors")
    ledger = Ledger.decode(ledger_bytes, cfg=trust)
    if hash_outer(params, momentum, round=record.version, ledger=ledger.digest()) != outer_hash:
        raise IntegrityError(f"{path}: FP32 weights, momentum or ledger do not match the outer hash of version "
                             f"{record.version}")
    return {"round": record.version, "params": params, "momentum": momentum, "ledger": ledger_bytes}, record
