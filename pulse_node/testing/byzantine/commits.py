"""What an attacker that does not train commits to: inner steps it never took (it cannot open them).

A commitment must carry an inner-step commitment (``loco/commit.py``) that passes every
receiver's header check (this run, round, base, payload, model size, steps, settings), so an
attacker that crafts its payload instead of training signs one naming batches, weights and
gradient roots it made up. It cannot answer a check drawn on it (nothing opens those roots):
the check is ``unanswered`` and it owes a check from then on (``loco/ledger.py``).
"""

from __future__ import annotations

import blake3

from pulse_node.chain.identity import Identity
from pulse_node.loco.commit import STATE_GLOBAL, BatchRef, InnerCommitment, StepCommit, sign_commitment
from pulse_node.testing.byzantine.world import World


def _made_up(*parts: object) -> bytes:
    return blake3.blake3(repr(parts).encode()).digest()


def fake_inner(identity: Identity, world: World, *, run_id: str, round: int, trainer: str, base: bytes,
               payload: bytes, settings: bytes) -> InnerCommitment:
    """A signed inner commitment of ``loco.inner_steps`` steps nobody took."""
    steps = tuple(StepCommit((BatchRef(trainer, round, k, _made_up("batch", trainer, round, k)),),
                             _made_up("weights", trainer, round, k), _made_up("grad", trainer, round, k), 0.5)
                  for k in range(world.cfg.loco.inner_steps))
    unsigned = InnerCommitment(run_id=run_id, round=round, trainer=trainer, signer="", base=base, payload=payload,
                               settings=settings, params=world.numel, leaf=world.leaf, adam_step=0,
                               state=STATE_GLOBAL, state_root=_made_up("state", trainer, round), steps=steps)
    return sign_commitment(identity, unsigned)
