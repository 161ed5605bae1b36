"""Assigned prompts: which problems batch ``b`` of version ``v`` by producer ``p`` must answer.

A batch is named by its ``BatchKey`` (run id, version, producer peer id, batch index). The key's
BLAKE3 digest seeds both the batch's prompts (``assigned_problems``, drawn from the task's train
split) and every token draw of its samples (``rl/seeded.py``). So a producer can neither choose
nor grind its prompts (the batch index is bounded by ``rollout_batches_per_version``), and a copy
of another peer's batch does not verify as its own: the producer in the key is the sender the
transport authenticated, never a field of the message. Torch-free.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import blake3
import msgpack

from pulse_node.rl.tasks import Problem, TaskSource

_DOMAIN = "pulse/rollout-batch/1"


@dataclass(frozen=True)
class BatchKey:
    """What one rollout batch is for: run, version, producer (peer id) and batch index."""

    run_id: str
    version: int
    producer: str
    batch: int

    def digest(self) -> bytes:
        """32 bytes that seed the batch's prompts and token draws (BLAKE3, domain-tagged)."""
        packed = msgpack.packb([_DOMAIN, self.run_id, self.version, self.producer, self.batch],
                               use_bin_type=True)
        return blake3.blake3(packed).digest()

    def group_id(self, prompt_index: int) -> str:
        """The GRPO group id of the samples of prompt ``prompt_index`` in this batch."""
        return f"{self.version}:{self.batch}:{prompt_index}"


def assigned_problems(task: TaskSource, key: BatchKey, n: int) -> list[Problem]:
    """The ``n`` train-split problems of batch ``key`` (the same on every machine).

    ``random.Random`` seeded with an int is MT19937 with a documented, platform-independent
    seeding; ``task.sample`` draws only from the train split.
    """
    return task.sample(n, random.Random(int.from_bytes(key.digest(), "big")))
