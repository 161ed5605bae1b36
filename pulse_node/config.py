"""One validated config object per role, built from defaults < TOML file < CLI overrides.

Importable without torch, hivemind or libp2p. Sections (``model``, ``task``, ``sampling``,
``grpo``, ``loco``) are defined next to the code that uses them; this module composes them
into ``TrainerConfig`` and ``InferenceConfig`` (one ``RoleConfig``, told apart by ``role``) and
``SwarmConfig``; settings both a node and a swarm have are declared once (``SharedSettings``,
``TrainingSettings``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, field_validator, model_validator

from pulse_node.configload import StrictModel, load_tree, validate_tree
from pulse_node.loco.config import LocoConfig
from pulse_node.net.dht.config import ANY_PORT, RECORD_TTL_S, USE_RELAY
from pulse_node.net.local.worker_config import RunId
from pulse_node.net.peers.budget import BudgetConfig
from pulse_node.rl.config import (
    ArithmeticTaskConfig,
    DecodeMode,
    GRPOConfig,
    ModelConfig,
    Precision,
    SamplingConfig,
    TaskConfig,
    VerifyConfig,
)
from pulse_node.vocab import DEFAULT_RUN_ID, Kind


class FaultConfig(StrictModel):
    """TESTING ONLY (chaos tests): make this node's own data plane misbehave on purpose.

    Off by default. With ``enabled = true`` every fetch and push of this node may be dropped,
    duplicated, reordered, delayed or corrupted at these rates (``testing/faults.py``), and the node
    says so loudly at start. Discovery (the DHT) is never faulted. Never enable on a real swarm.
    """

    enabled: bool = Field(False, description="TESTING ONLY: inject faults into this node's own fetches and pushes")
    seed: int = Field(0, description="fault RNG seed, mixed with the peer id (each node draws differently)")
    drop: float = Field(0.0, ge=0, le=1)
    duplicate: float = Field(0.0, ge=0, le=1)
    reorder: float = Field(0.0, ge=0, le=1)
    delay: float = Field(0.0, ge=0, le=1)
    corrupt: float = Field(0.0, ge=0, le=1)
    max_delay_s: float = Field(0.2, ge=0, le=60)
    spare_kinds: list[Kind] = Field(default_factory=list, description="message kinds never faulted")


class NetConfig(StrictModel):
    """Discovery (hivemind DHT) and data plane (py-libp2p) settings."""

    bootstrap: list[str] = Field(default_factory=list, description="multiaddrs of DHT entry points")
    dht_listen: list[str] = Field(default_factory=lambda: [ANY_PORT])
    wire_listen: list[str] = Field(default_factory=lambda: [ANY_PORT])
    announce: list[str] = Field(default_factory=list, description="publicly reachable DHT multiaddrs")
    wire_announce: list[str] = Field(default_factory=list, description="publicly reachable data-plane multiaddrs")
    use_relay: bool = Field(USE_RELAY, description="p2pd's circuit-relay transport (net/dht/config.py says why on)")
    use_auto_relay: bool = False
    client_mode: bool = False
    record_ttl_s: float = Field(RECORD_TTL_S, gt=1)
    head_poll_s: float = Field(2.0, gt=0, description="DHT lookup interval; head pushes arrive sooner")
    fetch_timeout_s: float = Field(60.0, gt=0)
    max_parallel_fetches: int = Field(4, ge=1, le=64)
    worker_start_timeout_s: float = Field(60.0, gt=0)
    budget: BudgetConfig = Field(default_factory=BudgetConfig,
                                 description="per-peer budgets of streams, requests, pushes and catch-ups (net/peers/budget.py)")
    faults: FaultConfig = Field(default_factory=FaultConfig, description="TESTING ONLY: chaos fault injection")

    @model_validator(mode="after")
    def _announce_needs_a_fixed_port(self) -> NetConfig:
        """An announced address names the port peers dial (the one you forwarded); a listener on
        port 0 gets a random port, so such an announcement is wrong however it is written."""
        for announce, listen, key, example in ((self.announce, self.dht_listen, "dht_listen", 31338),
                                               (self.wire_announce, self.wire_listen, "wire_listen", 31339)):
            if announce and all(_port(m) == "0" for m in listen):
                raise ValueError(
                    f"an announced address needs net.{key} on a fixed port (it listens on a random one, port 0): "
                    f"listen on the port you forwarded, e.g. --set 'net.{key}=[\"/ip4/0.0.0.0/tcp/{example}\"]'")
        return self


def _port(maddr: str) -> str | None:
    parts = maddr.split("/")
    return next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p in ("tcp", "udp")), None)


class ChainConfig(StrictModel):
    """Version publication and acceptance."""

    patch_mode: Literal["compact", "overwrite"] = "compact"
    position_context: bool = Field(
        False, description="compact patches: code positions with the base's exponent classes "
        "(~20% smaller, but every receiver pays an extra pass over each changed tensor; for slow links)")
    anchor_every: int = Field(10, ge=1, description="a full anchor every N versions")
    keep_versions: int = Field(64, ge=1, description="patches kept (and re-served) behind the head")
    keep_anchors: int = Field(2, ge=1)
    reference_size: bool = Field(
        False, description="trainer: also compute, per published version, the size the reference codec (grail "
        "v3.1) would take for the same change (a metric for the status and the swarm summary; costs "
        "0.2-0.5x the publisher's CPU work, so off by default)")
    trusted_trainers: list[str] = Field(
        default_factory=list,
        description="the trainer set: Ed25519 public keys (hex) of the trainers that may train, sign versions, "
        "decide rounds and serve trainer state (peers/trainerset.py); with none here nor in "
        "trusted_trainers_path, any peer announcing the trainer role is trusted (an open swarm: "
        "local swarms only, or with open_swarm = true)",
    )
    trusted_trainers_path: Path | None = Field(
        None, description="more trainer keys: a file with one hex key per line, or a directory of *.pub files "
        "(read at start; e.g. the keys compose's trainers write to the shared volume)")
    #: Open mode (``open_swarm``, no keys): keys are free, so what holds a member to one member's
    #: share does not bind anyone who can make keys: a key convicted of equivocation is replaced by
    #: a fresh one, a re-sync majority or the version step's "other members" can be one operator's
    #: keys, and fresh keys can fill the evidence book. What still holds: signatures, chain hashes,
    #: signed download sizes, the payload value bound and size caps, one decision per round from
    #: the coordinator whose turn it is. Nodes report ``trust_mode = "open"``; ``pulse-node status`` warns.
    open_swarm: bool = Field(
        False, description="DANGEROUS: with no trainer keys, let `pulse-node join` trust any peer that announces "
        "the trainer role on a non-loopback bootstrap (anyone can then sign versions and steer the model; "
        "equivocation bans, re-sync majorities and the version step bind nobody, keys being free)")
    open_trainers: bool = Field(
        False, description="let any key announcing the trainer role contribute payloads to the rounds (it never "
        "signs versions, decides rounds nor endorses admissions): keys without earned weight share one capped "
        "weight together (loco.trust.newcomer_weight), at most loco.trust.open_per_round of them enter a round, "
        "drawn by the last decision's digest, and the trust ledger weighs the rest (loco/ledger.py)")
    admission_quorum: int = Field(
        0, ge=0, description="members that must sign a new trainer's admission (0 = a majority of the configured keys)")
    admission_depth: int = Field(
        1, ge=1, description="who may endorse an admission: members within this many admissions of the configured "
        "keys (1 = the configured keys only; 2 = also the keys they admitted, ...); never a convicted key")
    admission_file: Path | None = Field(
        None, description="this trainer's admission to the trainer set (`pulse-node trainers admit`), "
        "carried in its peer record so every node can verify it")
    min_signers: int = Field(2, ge=1, description="distinct trainer-set members that must sign a version before "
                             "a node applies it; never more than the members live in discovery (a swarm with one "
                             "trainer runs). 1 = any one member's signed version moves every node (chain/gate.py)")
    max_version_step: int = Field(64, ge=1, description="refuse a record more than this many versions past the "
                                  "highest version another trainer-set member was seen signing (chain/gate.py)")
    catchup_min_gap: int = Field(4, ge=0, description="this many versions behind, ask peers for one catch-up "
                                 "patch instead of the patches (0 = never)")
    catchup_wait_s: float = Field(30.0, ge=0, description="how long to wait for a peer that is still making "
                                  "our catch-up patch before fetching the patches one by one")

    @field_validator("trusted_trainers")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        out = [k.strip().lower() for k in keys]
        for k in out:
            if not re.fullmatch(r"[0-9a-f]{64}", k):
                raise ValueError(f"trusted_trainers: {k[:80]!r} is not an Ed25519 public key (64 hex characters; "
                                 "`pulse-node keygen PATH --show` prints a node's key)")
        return out

    @model_validator(mode="after")
    def _open_means_no_keys(self) -> ChainConfig:
        if self.open_swarm and (self.trusted_trainers or self.trusted_trainers_path is not None):
            raise ValueError("chain.open_swarm trusts any announced trainer; it cannot be combined with trainer keys")
        return self


class SharedSettings(StrictModel):
    """Settings a swarm gives every node, declared once: ``NodeConfig`` and ``SwarmConfig`` both
    inherit them (``swarm/launcher.py`` copies them into each node's config)."""

    run_id: RunId = Field(DEFAULT_RUN_ID, description="the swarm this node joins (DHT keys, signed records)")
    seed: int = 0
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=ArithmeticTaskConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout_batches_per_version: int = Field(16, ge=0, le=4096, description="rollout batches an inference node "
                                             "sends per version held; trainers refuse batch indices past it")
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    net: NetConfig = Field(default_factory=NetConfig)
    chain: ChainConfig = Field(default_factory=ChainConfig)


class TrainingSettings(StrictModel):
    """How trainers train, declared once: ``TrainerConfig`` and ``SwarmConfig`` both inherit them."""

    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    loco: LocoConfig = Field(default_factory=LocoConfig)
    rollout_wait_s: float = Field(1.0, ge=0, description="wait this long for peers' rollouts, then make our own")
    eval_every: int = Field(1, ge=0, description="held-out eval every N versions (0 = never)")


class NodeConfig(SharedSettings):
    """Settings of one daemon process, whatever its role (the base of ``TrainerConfig`` and
    ``InferenceConfig``; a node's config is one of those, ``RoleConfig``)."""

    data_dir: Path = Path("./pulse-data")
    max_versions: int | None = Field(None, ge=1, description="stop after this version (default: run forever)")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(0, ge=0, le=65535, description="0 = any free port (written to data_dir/status.json)")
    torch_threads: int = Field(1, ge=0, description="torch intra-op threads (0 = torch default); 1 avoids "
                               "oversubscription when several nodes share a machine")


class DistConfig(StrictModel):
    """A trainer on several processes: ``torchrun --nproc-per-node N -m pulse_node join --role trainer``
    (FSDP2; ``trainer/distributed.py``). Ignored by a one-process trainer."""

    timeout_s: float = Field(1800.0, gt=0, description="timeout of one collective between the trainer's ranks")
    cpu_offload: bool = Field(False, description="FSDP2 CPUOffloadPolicy: each rank's shard of the weights, "
                              "gradients and AdamW moments lives in host memory and the optimizer steps there "
                              "(a GPU too small for its shard; slower; nothing to do on a CPU-only trainer)")


class TrainerFaultConfig(StrictModel):
    """TESTING ONLY: make this trainer cheat on purpose (``testing/trainer_faults.py``).

    Off by default. ``advantage_flip``: train correctly on verified rollouts but with inverted
    rewards (every advantage negated), committing the verified batches as if honest: every payload
    looks honest and only a spot check catches it. Never enable on a real swarm."""

    advantage_flip: bool = Field(False, description="TESTING ONLY: train on inverted advantages")


class TrainerConfig(TrainingSettings, NodeConfig):
    """A trainer: GRPO inner steps, PULSELoCo rounds, version publication."""

    role: Literal["trainer"] = "trainer"
    faults: TrainerFaultConfig = Field(default_factory=TrainerFaultConfig,
                                       description="TESTING ONLY: a cheating trainer (bench and tests)")
    genesis_wait_s: float = Field(5.0, ge=0, description="wait this long to meet the other trainers before publishing genesis")
    dist: DistConfig = Field(default_factory=DistConfig, description="a trainer on several processes (torchrun)")


class InferenceConfig(NodeConfig):
    """An inference node: pulls versions, generates and scores rollouts for trainers."""

    role: Literal["inference"] = "inference"
    compute: Precision = Field("fp32", description="what this node computes its rollouts' logits in: 'bf16' or "
                               "'fp16' as engines run (half the memory); each batch declares it and trainers widen "
                               "their checks by that precision's error (rl/precision.py)")
    decode: DecodeMode = Field("eager", description="how rollouts are decoded (the same draws in every mode): "
                               "'eager' (finished rows leave the batch and its KV cache; the fastest on the CPU), "
                               "'static' (a KV cache preallocated per batch shape, fixed-shape steps) or 'compiled' "
                               "(static, the step compiled by torch.compile: CUDA graphs on a GPU); bench/decode.py")


RoleConfig = Annotated[TrainerConfig | InferenceConfig, Field(discriminator="role")]
"""A node's config: the variant is picked by its ``role`` key."""
DEFAULT_ROLE = "inference"


def load_node_config(path: str | Path | None, overrides: list[str] | None = None, *,
                     role: str | None = None) -> TrainerConfig | InferenceConfig:
    """A node's validated config: defaults < file < ``overrides`` < ``role`` (else the file's
    ``role``, else inference), as the ``RoleConfig`` variant of that role."""
    tree = load_tree(path, overrides)
    if role is not None:
        tree["role"] = role
    tree.setdefault("role", DEFAULT_ROLE)
    return validate_tree(_role_adapter(), tree, path=path)


@functools.cache
def _role_adapter() -> TypeAdapter[TrainerConfig | InferenceConfig]:
    return TypeAdapter(RoleConfig)


class SwarmConfig(TrainingSettings, SharedSettings):
    """``pulse-node swarm``: a bootstrap plus T trainers and I inference nodes as local processes.

    The shared settings (``SharedSettings``) go to every node, the training settings
    (``TrainingSettings``) to trainers. Each node gets its own data dir under ``run_dir``.
    """

    trainers: int = Field(2, ge=1, le=16)
    trainer_ranks: list[Annotated[int, Field(ge=1, le=64)]] = Field(default_factory=list, description="processes of each trainer (torchrun, "
                                     "FSDP2), e.g. [2] runs trainer-0 on 2; missing entries are 1")
    inference: int = Field(2, ge=0, le=32)
    versions: int | None = Field(None, ge=1, description="stop once every node holds this version")
    run_dir: Path = Path("./pulse-swarm")
    fresh: bool = Field(True, description="start a new run: wipe every node dir in run_dir but its identity.key "
                       "(stores, decided rounds, evidence, logs, status)")
    host: str = "127.0.0.1"
    stop_timeout_s: float = Field(10.0, gt=0)
    start_timeout_s: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _checked_trainers_record(self) -> SwarmConfig:
        """A swarm that runs spot checks cannot run a trainer that cannot record its inner steps."""
        problem = recording_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self


def runs_spot_checks(cfg: TrainerConfig | SwarmConfig) -> bool:
    """Whether this swarm re-runs drawn inner steps in its rounds (``trainer/spot_round.py``):
    ``loco.spot.rate`` above 0, with ``chain.open_trainers`` (an open trainer earns weight only by
    checks passed) or ``loco.spot.keyed``. Every trainer of a swarm computes the same from its
    config: then a round commitment must carry an inner-step commitment for its round
    (``trainer/commits.py``), else no check could ever be drawn on its trainer."""
    return cfg.loco.spot.rate > 0 and (cfg.chain.open_trainers or cfg.loco.spot.keyed)


def recording_problem(cfg: TrainerConfig | SwarmConfig) -> str | None:
    """Why a trainer configured by ``cfg`` (on one process or several) cannot take part in its
    swarm's spot checks (None: it can, or the swarm runs none). Its commitments would carry no
    inner-step commitment, and every trainer of the swarm would refuse them: it would train unheard."""
    if not runs_spot_checks(cfg) or cfg.grpo.bf16_compute:
        return None
    return (f"this swarm runs spot checks (loco.spot.rate = {cfg.loco.spot.rate} with chain.open_trainers or "
            "loco.spot.keyed), so every round commitment must carry the trainer's recorded inner steps, and with "
            "grpo.bf16_compute off its inner steps are not recorded (a check re-runs the BF16 forward): every "
            "trainer would refuse its commitments. Run each trainer with grpo.bf16_compute on, or use a swarm "
            "without chain.open_trainers and loco.spot.keyed (or with loco.spot.rate = 0)")
