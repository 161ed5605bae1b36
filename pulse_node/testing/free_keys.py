"""Attacks of free identities (issue 21, items 2-5), for ``bench/adversary.py``: each runs as its
own attacker process (``python -m pulse_node.testing.attack NAME``) with fresh keys, each key a
``Hostile`` (its own DHT and wire workers, ``testing/attackers.py``). Item 1, the record flood,
needs no node of its own (``testing/flood.py``).

- ``junk_rollouts`` (item 2): every fresh key pushes, for each new version, the batch the
  trainers expect of it (the right assigned prompts, ``rl/assign.py``) answered by a randomly
  initialised model of the swarm's shape (junk completions that pass every cheap check).
- ``pool_hog`` (item 3): four keys stall streams at every node (``slow_drip`` from each).
- ``catchup_sybils`` (item 4): four keys ask every node for distinct catch-up patches.
- ``hostile_status`` (item 5): a record whose ``metrics_url`` names ``localhost`` through a
  ``/dns4/`` address, at a listener that drips one byte at a time; the operator's
  ``pulse-node status`` must not hang on it.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from pulse_node.testing.attackers import ATTACKS, SYBILS, Attack, Hostile, Report, _loop

#: the inference node config the junk rollouts imitate (set by ``bench/adversary.py``)
NODE_CONFIG_ENV = "PULSE_ATTACK_NODE_CONFIG"


def junk_rollouts(h: Hostile, deadline: float) -> Report:
    """For each new version, the batch expected of this key, with completions of a random model."""
    from pulse_node.config import InferenceConfig
    from pulse_node.configload import load_config
    from pulse_node.rl.assign import BatchKey
    from pulse_node.rl.config import GRPOConfig
    from pulse_node.rl.policy import build_policy
    from pulse_node.rl.rollout import encode_rollouts
    from pulse_node.rl.sampler import RolloutWorker
    from pulse_node.rl.tasks import make_task_source

    cfg = load_config(InferenceConfig, os.environ[NODE_CONFIG_ENV])
    policy = build_policy(cfg.model, cfg.task, seed=int.from_bytes(os.urandom(4), "big"),
                          grpo_cfg=GRPOConfig(warmstart_steps=0))  # random weights: junk under the right prompts
    worker, tasks, sent = RolloutWorker(policy, cfg.sampling), make_task_source(cfg.task), set()

    def step() -> None:
        for rec in h.others("trainer"):
            v = rec.version or 0
            if (rec.peer_id, v) in sent:
                continue
            worker.version = v
            batch = worker.generate_batch(tasks, BatchKey(cfg.run_id, v, h.peer_id, 0))
            sent.add((rec.peer_id, v))
            h.push(rec, "rollouts", encode_rollouts(batch))

    _loop(deadline, 0.2, step)
    return {"tried": "per version, the batch assigned to this key (right prompts) with a random model's completions",
            "batches": len(sent)}


class _Drip:
    """A loopback listener that answers every connection one byte per ``every`` seconds."""

    def __init__(self, every: float = 0.2) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.every, self.connections = every, 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            for b in b"HTTP/1.0 200 OK\r\nX-Drip: " + b"[bold red]" * 1000:
                if self.stop.wait(self.every):
                    return
                try:
                    conn.sendall(bytes([b]))
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def hostile_status(h: Hostile, deadline: float) -> Report:
    """A record luring the operator's status tool to ``localhost`` (a name, through ``/dns4/``)
    and to the link-local metadata address, at a listener that drips."""
    drip = _Drip()
    try:
        dns = f"/dns4/localhost/tcp/{drip.port}/p2p/{h.peer_id}"
        link_local = f"/ip4/169.254.169.254/tcp/80/p2p/{h.peer_id}"
        h.announce("inference", None, wire_maddrs=[*h.maddrs[:6], dns, link_local],
                   metrics_url=f"http://localhost:{drip.port}/metrics")
        _loop(deadline, 1.0, lambda: None)
    finally:
        drip.close()
    return {"tried": "metrics_url http://localhost (announced as /dns4/localhost) at a one-byte drip, and a "
                     "link-local address", "drip_connections": drip.connections}


#: this module's attacks, and the ones run from several fresh keys at once (attack, keys)
FREE_KEY_ATTACKS: dict[str, Attack] = {
    "junk_rollouts": junk_rollouts, "hostile_status": hostile_status}
FREE_KEY_SYBILS: dict[str, tuple[str, int]] = {
    "junk_rollouts": ("junk_rollouts", 4), "pool_hog": ("slow_drip", 4), "catchup_sybils": ("catchup_flood", 4)}


def all_attacks() -> tuple[dict[str, Attack], dict[str, tuple[str, int]]]:
    """Every attack and Sybil variant ``run_attack`` may run (issue 13's and these)."""
    return {**ATTACKS, **FREE_KEY_ATTACKS}, {**SYBILS, **FREE_KEY_SYBILS}


def node_config_path(run_root: Path) -> Path:
    """Where the bench's first inference node keeps its config (what ``junk_rollouts`` imitates)."""
    return run_root / "inference-0" / "node.toml"
