"""The processes of one trainer under torchrun: process group, commands from rank 0, object collectives.

Rank 0 is the node (identity, store, network workers, the role); ranks 1..N-1 only compute.
Rank 0 drives them: ``post(name)`` puts a command under ``cmd/<seq>`` in the TCP store torchrun
set up for the group (``MASTER_ADDR:MASTER_PORT``, under a prefix of its own), and every rank,
rank 0 included, then runs that command's method of its ``ShardWork``, which exchanges data with
collectives (``bcast``/``scatter``/``gather`` of objects here, tensors in ``trainer/shards.py``).
Ranks > 0 wait for the next command by polling the store, not in a collective, so a node that
idles for an hour (between rounds, after ``max_versions``) never trips a collective timeout;
every command ends in a collective rank 0 cannot pass before all ranks joined it, so rank 0
deletes the previous command's key when posting the next.

Collectives time out after ``TrainerConfig.dist.timeout_s`` (the process group's timeout). When
rank 0 exits or dies, torchrun stops the other ranks (a rank whose store is gone exits by itself).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("pulse.ranks")

COMMAND_POLL_S = 0.02  # ranks > 0 check for rank 0's next command this often
STOP_GRACE_S = 30.0  # after SIGTERM, a rank > 0 waits this long for rank 0's "stop" (torchrun's own grace)


class Ranks:
    """This process's place in the trainer's process group, and the command channel."""

    def __init__(self, *, timeout_s: float) -> None:
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.seq = 0
        # the store torchrun set up for the process group (reachable by every rank by
        # construction), as one more client; keys under a prefix of this job attempt
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=timeout_s))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.store = dist.PrefixStore(f"pulse-trainer/{attempt}/", store)

    # ---- commands ----------------------------------------------------------------------
    def post(self, name: str) -> None:
        """Rank 0: the next command every rank runs."""
        self.seq += 1
        self.store.set(f"cmd/{self.seq}", name)
        if self.seq > 1:
            self.store.delete_key(f"cmd/{self.seq - 1}")  # every rank finished it (module doc)

    def next(self, stopping: threading.Event) -> str | None:
        """Ranks > 0: wait for rank 0's next command; None once asked to stop (SIGTERM) while
        rank 0 stayed silent for ``STOP_GRACE_S``."""
        key = f"cmd/{self.seq + 1}"
        stop_at: float | None = None
        clock = threading.Event()
        while not self.store.check([key]):
            if stopping.is_set():
                stop_at = stop_at or time.monotonic() + STOP_GRACE_S
                if time.monotonic() > stop_at:
                    log.warning("rank %d: asked to stop and rank 0 sent nothing for %.0f s", self.rank, STOP_GRACE_S)
                    return None
            clock.wait(COMMAND_POLL_S)
        self.seq += 1
        return self.store.get(key).decode()

    # ---- object collectives (pickled; only between this trainer's own processes) --------
    def bcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def scatter(self, objs: list[Any] | None) -> Any:
        """Rank 0 passes one object per rank; every rank gets its own."""
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs if self.rank == 0 else None, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's object, in rank order, on rank 0 (None elsewhere)."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Rank 0: tell every rank to exit and wait (bounded) until they all acknowledged."""
        self.post("stop")
        deadline = time.monotonic() + timeout_s
        clock = threading.Event()
        while self.store.add("stopped", 0) < self.world - 1 and time.monotonic() < deadline:
            clock.wait(COMMAND_POLL_S)

    def acknowledge_stop(self) -> None:
        """Ranks > 0: rank 0's ``stop`` was received."""
        self.store.add("stopped", 1)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
