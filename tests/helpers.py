"""Helpers shared by the tests (fixtures live in ``conftest.py``): predicate waits, small configs.

Imported as ``from helpers import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from pulse_node.daemon.status_model import StatusReport
from pulse_node.rl.config import GRPOConfig, ModelConfig, SamplingConfig, SoloConfig, task_config
from pulse_node.testing.inprocess import node_status, node_version

T = TypeVar("T")

__all__ = ["all_at_version", "assert_trainers_identical", "gather", "node_config", "node_version", "published", "read_status",
           "tiny_overrides", "tiny_solo", "wait_for"]


def session_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory the whole test run shares: with pytest-xdist, every worker's (their common
    temporary root), else this process's."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    path.mkdir(exist_ok=True)
    return path


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (another worker building into it waits); closing
    the file releases it."""
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def wait_for(predicate: Callable[[], T], *, timeout: float, what: str | Callable[[], str],
             interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Fails the test after ``timeout`` seconds, saying what it waited for (``what``, or what the
    callable ``what`` returns then, e.g. a report of the processes involved).
    """
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)
    return result


def gather(fetch: Callable[[], Iterable[T]], *, count: int, timeout: float, what: str) -> list[T]:
    """Call ``fetch`` until it has returned at least ``count`` items in all; all of them."""
    got: list[T] = []
    wait_for(lambda: got.extend(fetch()) or len(got) >= count, timeout=timeout, what=what)
    return got


def read_status(data_dir: Path) -> StatusReport:
    """A node's status.json, parsed (a node that has written none yet reads as a fresh report)."""
    return node_status(data_dir) or StatusReport(role="node", peer_id="", run_id="")


def published(data_dir: Path) -> dict[int, tuple[str, str]]:
    """Version -> (published state hash, FP32 global + momentum hash) of what a trainer published."""
    return {h.version: (h.state_hash, h.global_hash) for h in read_status(data_dir).history}


def assert_trainers_identical(dirs: dict[str, Path], versions: range) -> None:
    """Every trainer published every version of ``versions``, all with the same hashes."""
    hashes = {name: published(d) for name, d in dirs.items()}
    for v in versions:
        at_v = {name: h.get(v) for name, h in hashes.items()}
        assert None not in at_v.values(), f"version {v} was not published by every trainer: {at_v}"
        assert len(set(at_v.values())) == 1, f"trainers differ at version {v}: {at_v}"


def open_trainers_chain(tmp: Path, members: Iterable[str]) -> dict:
    """A ``chain`` config trusting the keys of ``members`` (each created in ``tmp / name``, where its
    node's data dir will be) and letting any other key train (``chain.open_trainers``)."""
    from pulse_node.chain.identity import Identity

    keys = [Identity.load_or_create(tmp / n / "identity.key").public_key_hex for n in members]
    return {"trusted_trainers": keys, "open_trainers": True}


def all_at_version(dirs: Iterable[Path], version: int) -> Callable[[], bool]:
    """A predicate: every node of ``dirs`` holds ``version`` (or a later one)."""
    return lambda: all(node_version(d) >= version for d in dirs)


def tiny_overrides(cache_dir: str | Path) -> dict:
    """A model and RL loop small enough for multi-node tests on 2 CPU cores."""
    return {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "cache_dir": str(cache_dir)},
        "task": {"digits": 2},
        "sampling": {"prompts_per_batch": 4, "group_size": 4, "max_new_tokens": 6},
    }


def node_config(cls, tmp: Path, name: str, *, cache_dir: Path, **extra):
    """A tiny trainer or inference config with data dir ``tmp / name`` (the ``node_cfg`` fixture)."""
    from pulse_node.config import TrainerConfig

    base = tiny_overrides(cache_dir)
    base.update(data_dir=str(tmp / name), seed=3)
    if cls is TrainerConfig:
        base.update(grpo={"warmstart_steps": 30, "lr": 1e-3}, loco={"inner_steps": 2, "deadline_s": 20},
                    rollout_wait_s=0.5, eval_every=0, genesis_wait_s=1.0)
    base.update(extra)
    return cls.model_validate(base)


def tiny_solo(cache_dir: Path, **grpo: object) -> SoloConfig:
    """A solo config with tiny dims, so each RL test runs in seconds."""
    return SoloConfig(
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=24, device="cpu", cache_dir=str(cache_dir)),
        task=task_config(digits=2, eval_size=20),
        sampling=SamplingConfig(max_new_tokens=4, group_size=4, prompts_per_batch=4),
        grpo=GRPOConfig(**({"warmstart_steps": 0, "lr": 1e-2} | grpo)),
        minutes=1.0, max_steps=2, threads=1,
    )


def commit_to(agreement, identity, sender: str, data: bytes, *, round: int, base: bytes) -> None:
    """Hand ``agreement`` the round commitment ``sender`` (key ``identity``) signs for the payload
    ``data`` (commit-reveal: a payload counts only once its commitment is held); carrying an inner
    commitment on the agreement's terms (``inner_commitment``) if its swarm runs spot checks."""
    from pulse_node.loco.decision import payload_digest
    from pulse_node.loco.roundcommit import encode_commit, make_commit

    run_id, digest, terms = agreement.ctx.cfg.run_id, payload_digest(data), agreement.commits
    spot = inner_commitment(identity, sender, run_id=run_id, round=round, base=base, payload=digest, params=terms.params,
                            settings=terms.settings()) if terms.checked else b""
    c = make_commit(identity, run_id=run_id, epoch=agreement.table.epoch(), round=round, base=base, trainer=sender,
                    payload=digest, spot=spot)
    agreement.offer_commit(sender, encode_commit(c))


def inner_commitment(identity, trainer: str, *, run_id: str, round: int, base: bytes, payload: bytes, params: int,
                     settings: bytes | None = None, steps: int = 1, batches: int = 1) -> bytes:
    """``trainer``'s encoded inner commitment (key ``identity``) of ``steps`` steps of ``batches``
    batches each of round ``round`` over ``params`` weights, behind the payload of digest
    ``payload``: what a commitment must carry in a swarm that runs spot checks (its roots are
    placeholders: nothing re-runs it)."""
    from pulse_node.loco.commit import (
        STATE_GLOBAL,
        BatchRef,
        InnerCommitment,
        StepCommit,
        encode_commitment,
        sign_commitment,
    )

    step = StepCommit(tuple(BatchRef(trainer, round, i, base) for i in range(batches)), base, base, 0.5)
    inner = InnerCommitment(run_id=run_id, round=round, trainer=trainer, signer="", base=base, payload=payload,
                            settings=settings or bytes(32), params=params, leaf=256, adam_step=0, state=STATE_GLOBAL,
                            state_root=base, steps=(step,) * steps)
    return encode_commitment(sign_commitment(identity, inner))


def hub_agreement(tmp_path: Path, hub, me, settings: dict, *, round: int, epoch: bytes, base: tuple[bytes, dict],
                  shapes: dict, **agreement):
    """A ``RoundAgreement`` of trainer ``me`` on a ``MemoryHub``, its config ``settings`` (plus its
    data dir), announced as a trainer at ``round``, with a fresh ledger; ``agreement`` goes to the
    agreement as is (``verdicts=``, ``refutes=``, ...)."""
    from pulse_node.chain.peer import PeerStatus
    from pulse_node.chain.store import VersionStore
    from pulse_node.config import TrainerConfig
    from pulse_node.daemon.context import RoleContext
    from pulse_node.daemon.status import NodeStatus
    from pulse_node.loco.ledger import Ledger
    from pulse_node.net.wire.serving import store_resolver
    from pulse_node.testing.adversaries import peer_id
    from pulse_node.trainer.agreement import RoundAgreement

    me_id = peer_id(me)
    cfg = TrainerConfig.model_validate({"data_dir": str(tmp_path / me_id), **settings})
    store = VersionStore(tmp_path / me_id / "store")
    transport = hub.join(me_id, store_resolver(store.root))
    transport.publish(PeerStatus(role="trainer", version=round, node_key=me.public_key_hex))
    ctx = RoleContext(cfg=cfg, identity=me, store=store, transport=transport,
                      status=NodeStatus(role="trainer", peer_id=me_id, run_id=cfg.run_id))
    ledger = Ledger(cfg.loco.trust)
    return RoundAgreement(ctx, shapes=shapes, current_round=lambda: round, epoch=lambda: epoch, base=lambda: base,
                          ledger=lambda: ledger, **agreement)


def hold_evidence(spot, accuser, target: str, outcome, *, round: int) -> bytes:
    """Hand ``spot`` (``SpotRounds``) ``accuser``'s signed evidence against ``target``'s round
    ``round`` as re-checked here with ``outcome`` (a ``Recheck``); its digest, as a verdict names it."""
    import blake3

    from pulse_node.loco.spot_evidence import (
        Accusation,
        decode_evidence,
        encode_evidence,
        make_evidence,
        sign_accusation,
    )
    from pulse_node.testing.adversaries import peer_id
    from pulse_node.trainer.spot_evidence import RecheckResult

    a = sign_accusation(accuser, Accusation(run_id=spot.cfg.run_id, round=round, target=target, accuser=peer_id(accuser),
                                            signer="", step=1, leaves=(0,), reason="gradient", keep=1.0,
                                            commitment=b"c", next_commitment=b"", exhibits=()))
    data = encode_evidence(make_evidence(a, {}))
    digest = blake3.blake3(data).digest()
    spot.evidence[digest] = decode_evidence(data)
    spot._judge(digest, RecheckResult(outcome, "", "re-run here"))
    return digest
