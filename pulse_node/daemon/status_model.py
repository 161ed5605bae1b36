"""The declared, versioned content of a node's ``status.json`` and ``/status``: ``StatusReport``.

Every field a node reports is declared here, with a type and a description; the node fills it
through ``NodeStatus`` (``daemon/status.py``), counters by attribute (``with status.trainer() as c:
c.rounds += 1``, checked by the type checker), counts by reason keyed by the refusal enums of
``vocab.py`` (their JSON text is the reason's name), and every reader
(the dashboard, the swarm launcher and its summary, the chaos ledger, tests, benchmarks) parses
it back with ``parse_status`` / ``read_status`` and reads attributes. ``/metrics`` gauges are
derived from the numeric fields declared here (``gauge_fields``). Torch-free: ``ops`` imports it.

Sections: common node fields at the top level; ``counters`` (every node), ``trainer`` or
``inference`` (the node's role only), ``data_plane`` (what its transport reports); ``history``
(one ``VersionEntry`` per version published or applied, the last ``HISTORY_LEN``) and
``recent_errors``. Any change to a declared field bumps ``STATUS_SCHEMA``; a reader given
another schema gets a ``StatusSchemaError`` naming both versions, never a half-read status.
Nothing here is for tests only: fault injection reports its counts in its own file
(``testing/faults.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar

import pydantic
from pydantic import Field

from pulse_node.errors import PulseError
from pulse_node.vocab import BatchRefusal, BudgetRefusal, DecisionRefusal, LocoRefusal

#: version of the status schema; bump it on any change to a declared field
STATUS_SCHEMA = 10
HISTORY_LEN = 200
ERRORS_KEPT = 20
ERROR_CHARS = 300


class StatusSchemaError(PulseError):
    """A status (file or ``/status`` answer) is not one this pulse-node can read."""


class StatusFieldError(ValueError):
    """A node tried to report a field or counter the status model does not declare (a bug)."""


class _Section(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


K = TypeVar("K")


def count(table: dict[K, int], key: K, amount: int = 1) -> None:
    """Add ``amount`` to ``key`` of a by-reason (or by-peer) counter: ``count(c.loco_refused, LocoRefusal.BANNED)``."""
    table[key] = table.get(key, 0) + amount


class NodeCounters(_Section):
    """Counters of every node."""

    errors: int = Field(0, ge=0, description="errors recorded")
    rejected: int = Field(0, ge=0, description="peer inputs rejected (bad signature, digest, hash or format)")
    unexpected: int = Field(0, ge=0, description="peer inputs whose handling raised an exception no check "
                            "anticipated: refused, sender struck, the node went on (peers/contain.py; a bug to report)")


class TrainerCounters(_Section):
    """Counters of a trainer."""

    rounds: int = Field(0, ge=0, description="PULSELoCo rounds completed")
    rollouts_in: int = Field(0, ge=0, description="rollouts received from inference nodes")
    rollouts_used: int = Field(0, ge=0, description="rollouts consumed by GRPO steps")
    rollouts_own: int = Field(0, ge=0, description="rollouts the trainer generated itself (none arrived in time)")
    rollouts_refused: int = Field(0, ge=0, description="rollouts in batches refused by verification or intake "
                                  "(stale, wrong assignment, forged numbers, over budget)")
    patch_bytes_total: int = Field(0, ge=0, description="bytes of the patches published")
    dense_bytes_total: int = Field(0, ge=0, description="bytes a dense BF16 copy of the same versions would take")
    reference_bytes_total: int = Field(0, ge=0, description="bytes the reference codec (grail v3.1) would take "
                                       "for the same patches")
    loco_bytes_out: int = Field(0, ge=0, description="PULSELoCo payload bytes pushed to other trainers")
    loco_fetched: int = Field(0, ge=0, description="decided PULSELoCo payloads fetched from peers")
    loco_base_mismatch: int = Field(0, ge=0, description="PULSELoCo payloads not decoded: made on another "
                                    "global state")
    decisions_made: int = Field(0, ge=0, description="round decisions signed as coordinator")
    decisions_pulled: int = Field(0, ge=0, description="round decisions pulled from live trainers")
    decisions_rejected: int = Field(0, ge=0, description="round decisions rejected (signature, signer, round)")
    decision_conflicts: int = Field(0, ge=0, description="second, differing decisions for a round")
    loco_refused: dict[LocoRefusal, int] = Field(default_factory=dict, description="PULSELoCo payloads refused, by reason "
                                         "(not_member, out_of_bound, too_large, malformed, too_far_ahead, "
                                         "duplicate, banned, uncommitted, bad_commitment, equivocation, spot_terms, other_state)")
    commits_held: int = Field(0, ge=0, description="round commitments of other trainers held (checked) this run")
    commits_fetched: int = Field(0, ge=0, description="round commitments a decision named that this trainer lacked, "
                                 "fetched and held (trainer/decisions.py)")
    spot_drawn: int = Field(0, ge=0, description="spot checks drawn in the rounds this trainer applied (trainer/spot_round.py)")
    spot_passed: int = Field(0, ge=0, description="spot checks this trainer ran as the verifier that passed")
    spot_failed: int = Field(0, ge=0, description="... that failed (unanswered, or a mismatch with evidence)")
    spot_seconds: float = Field(0.0, ge=0, description="seconds this trainer spent on checks and evidence re-checks "
                                "(its background thread; against its rounds' time: the 10% budget)")
    decisions_refused: dict[DecisionRefusal, int] = Field(default_factory=dict, description="round decisions "
                                                          "refused, by reason (not_member, bad_decision, "
                                                          "out_of_bound, equivocation, banned, other_base, "
                                                          "not_designated, omits_commitment)")
    loco_bound_ratio_max: float = Field(0.0, ge=0, description="largest |value| / payload value bound among the "
                                        "payloads this trainer made or admitted (refused ones not counted)")
    loco_clipped: int = Field(0, ge=0, description="entries of our own payloads clipped to half the payload value "
                              "bound (the excess stays in the error feedback)")
    rounds_left_out: int = Field(0, ge=0, description="rounds whose decision left this trainer's payload out")
    resyncs: int = Field(0, ge=0, description="states adopted from another trainer")
    forks: int = Field(0, ge=0, description="rounds closed without an update (no decided payloads, no re-sync)")


class InferenceCounters(_Section):
    """Counters of an inference node (the syncer's and the trust policy's, and rollouts)."""

    patches_applied: int = Field(0, ge=0, description="patches applied")
    patch_bytes_total: int = Field(0, ge=0, description="bytes of patches received")
    fetch_errors: int = Field(0, ge=0, description="failed fetches of a record or patch")
    apply_errors: int = Field(0, ge=0, description="fetched patches that did not apply")
    gaps: int = Field(0, ge=0, description="gaps in the chain nobody served")
    anchor_loads: int = Field(0, ge=0, description="anchors (full checkpoints) loaded")
    catchups: int = Field(0, ge=0, description="catch-up patches applied instead of several patches")
    catchup_misses: int = Field(0, ge=0, description="catch-up requests that failed")
    catchup_bytes_total: int = Field(0, ge=0, description="bytes of catch-up patches received")
    rollouts_sent: int = Field(0, ge=0, description="rollouts sent to trainers")
    strikes: dict[str, int] = Field(default_factory=dict, description="rejections per sending peer")
    bans: dict[str, int] = Field(default_factory=dict, description="bans per peer")


class DataPlane(_Section):
    """What the node's transport reports (``Transport.stats()``)."""

    bytes_in: int = Field(0, ge=0, description="data-plane bytes received")
    bytes_out: int = Field(0, ge=0, description="data-plane bytes sent")
    bytes_in_by_kind: dict[str, int] = Field(default_factory=dict, description="bytes received per request kind")
    bytes_out_by_kind: dict[str, int] = Field(default_factory=dict, description="bytes sent per request kind")
    bytes_in_by_plane: dict[str, int] = Field(default_factory=dict, description="bytes received per plane")
    bytes_out_by_plane: dict[str, int] = Field(default_factory=dict, description="bytes sent per plane")
    hivemind_push_errors: int = Field(0, ge=0, description="failed pushes over hivemind's p2pd")
    loco_fallbacks: int = Field(0, ge=0, description="PULSELoCo pushes that fell back to the wire")
    wire_errors: int = Field(0, ge=0, description="failed wire requests")
    duplicate: bool = Field(False, description="another live node publishes under this node's identity")
    refused: dict[BudgetRefusal, int] = Field(default_factory=dict, description="peer requests refused by their "
                                              "per-peer budget, by reason (net/peers/budget.py)")


class TrustEntry(_Section):
    """One trainer key as the trust ledger of the replicated outer state knows it (``loco/ledger.py``)."""

    key: str = Field(description="the trainer's peer id")
    weight: float = Field(0.0, ge=0, description="its trust weight in the last round (0: not applied)")
    member: bool = Field(False, description="root or admitted (else an open trainer)")
    contributed: int = Field(0, ge=0, description="rounds whose decision applied its payload")
    passed: int = Field(0, ge=0, description="spot checks passed")
    failed: int = Field(0, ge=0, description="spot checks failed")
    unrevealed: int = Field(0, ge=0, description="rounds it entered with a commitment and never revealed its payload")
    owing: bool = Field(False, description="failed its last check: out of the rounds until it passes one")
    convicted: bool = Field(False, description="convicted: out for good")


class SenderReport(_Section):
    """What one rollout sender contributed to a trainer and why batches were refused: the tally
    ``trainer/intake.py`` keeps per sender, reported as is."""

    accepted: int = Field(0, ge=0, description="batches trained on")
    accepted_rollouts: int = Field(0, ge=0, description="rollouts in those batches")
    rejected: dict[BatchRefusal, int] = Field(default_factory=dict, description="batches refused, by reason")
    queued: int = Field(0, ge=0, description="batches waiting")
    queued_bytes: int = Field(0, ge=0, description="bytes of the batches waiting")
    strikes: int = Field(0, ge=0, description="refusals that count against the sender")
    banned: bool = Field(False, description="the sender is ignored")
    last_seen: float = Field(0.0, description="when it last sent a batch (unix time)")


class VersionEntry(_Section):
    """One version a node published (trainer) or applied (inference)."""

    version: int = Field(ge=0)
    state_hash: str
    at: float = Field(default_factory=time.time, description="when it was published or applied (unix time)")
    patch_bytes: int = Field(0, ge=0, description="bytes of its patch (inference: as received; the catch-up "
                             "patch's bytes if it came by one)")
    dense_bytes: int | None = Field(None, ge=0, description="trainer: bytes of a dense BF16 copy")
    reference_bytes: int | None = Field(None, ge=0, description="trainer: bytes of the reference codec's patch")
    changed: float | None = Field(None, ge=0, le=1, description="trainer: fraction of BF16 entries changed")
    global_hash: str | None = Field(None, description="trainer: hash of the FP32 global weights and momentum")
    reward: float | None = Field(None, description="trainer: mean reward of the batches it was trained on")
    eval: float | None = Field(None, description="trainer: held-out accuracy, when evaluated")
    contributors: int | None = Field(None, ge=0, description="trainer: payloads averaged into this version (0: its "
                                     "round closed without an update; None: genesis or adopted)")
    catchup_from: int | None = Field(None, ge=0, description="inference: reached by one catch-up patch from "
                                     "this version")


AlertKind = Literal[
    "fork",  # state hashes of nodes at one version disagree
    "no_contributors",  # a version was published with no payload averaged into it: learning stopped there
    "round_without_update",  # a trainer closed rounds without an update (no decided payloads, no re-sync)
    "repeated_error",  # a node keeps failing the same way
    "duplicate_identity", "equivocation", "open_trust", "node", "source",
]
#: alerts that fail ``pulse-node swarm --versions N`` (exit code 2) when its last snapshot holds them
FAILING_ALERTS: tuple[AlertKind, ...] = ("fork", "no_contributors", "round_without_update", "duplicate_identity")


class Alert(pydantic.BaseModel):
    """Something an operator must act on, as ``pulse-node status``, the swarm's terminal lines and
    its JSON summary all report it (built by ``ops/snapshot.py`` from the nodes' statuses)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    kind: AlertKind
    level: Literal["warn", "fail"]
    message: str

    @property
    def failing(self) -> bool:
        """Whether it fails a run that ends with it (``FAILING_ALERTS``)."""
        return self.kind in FAILING_ALERTS


class EvalPoint(_Section):
    version: int = Field(ge=0)
    accuracy: float


class StandingReport(_Section):
    """How this node ranks peers (``peers/standing.py``): by what it saw them do, never by what
    their records claim; peers without standing share a fixed allotment together."""

    found: int = Field(0, ge=0, description="peers discovery returned (fresh keys included)")
    view: int = Field(0, ge=0, description="peers in the view: members, peers with standing, a few newcomers")
    newcomers_in_view: int = Field(0, ge=0, description="peers without standing in the view (capped)")
    remembered: int = Field(0, ge=0, description="peers whose observations this node keeps")
    with_standing: int = Field(0, ge=0, description="non-member peers that earned standing (verified work)")
    demoted: int = Field(0, ge=0, description="peers ranked below untried newcomers (failures, strikes)")
    pushes_submitted: int = Field(0, ge=0, description="background push jobs submitted (heads)")
    pushes_superseded: int = Field(0, ge=0, description="push jobs replaced by a newer one before they ran")
    pushes_failed: int = Field(0, ge=0, description="background pushes that failed or timed out")
    pushes_skipped: int = Field(0, ge=0, description="peers left out of a push fan-out (newcomers past the cap)")


class ErrorEntry(_Section):
    at: float
    message: str = Field(max_length=ERROR_CHARS)


class EvidenceEntry(_Section):
    """A trainer-set key this node convicted of equivocation (``chain/evidence.py``) and refuses."""

    key: str = Field(description="the convicted Ed25519 key (hex)")
    kind: Literal["head", "decision", "commitment"] = Field(
        description="head: two records for one version; decision / commitment: two round decisions / commitments "
                    "for one round")
    at: int = Field(ge=0, description="the version (head) or round (decision, commitment) both messages are about")
    found_at: float = Field(description="when this node verified the evidence (unix time)")


class StatusReport(_Section):
    """What one node reports about itself."""

    schema_version: int = Field(STATUS_SCHEMA, alias="schema", description="version of this status schema")
    role: str = Field(description="trainer, inference (node: a daemon without a role)")
    peer_id: str
    run_id: str
    started_at: float = Field(default_factory=time.time, description="when this process started (unix time)")
    updated_at: float = Field(default_factory=time.time, description="last change (unix time)")
    version: int = Field(-1, ge=-1, description="newest version this node holds (-1: none)")
    state_hash: str = ""
    chain_hash: str = ""
    lowest: int = Field(-1, ge=-1, description="lowest version it serves patches from (-1: none)")
    anchors: list[int] = Field(default_factory=list, description="anchor versions it serves")
    peers: int = Field(0, ge=0, description="live peers seen in discovery")
    reward_mean: float | None = Field(None, description="mean reward of the latest rollouts")
    eval_accuracy: float | None = Field(None, description="held-out accuracy of the latest evaluated version")
    first_eval: EvalPoint | None = Field(None, description="trainer: the first version it evaluated (kept when "
                                          "the history moves past it)")
    contributors: int | None = Field(None, ge=0, description="trainer: payloads averaged in its last round")
    ranks: int | None = Field(None, ge=1, description="trainer under torchrun: processes of its FSDP2 group")
    rank_rss_mb: list[int] = Field(default_factory=list, description="trainer under torchrun: RSS (MB) per rank")
    rank_peak_rss_mb: list[int] = Field(default_factory=list, description="trainer under torchrun: peak RSS (MB) per rank")
    rollout_senders: dict[str, SenderReport] = Field(default_factory=dict, description="trainer: per rollout "
                                                     "sender, batches accepted and refused")
    rollout_settings_error: str = Field("", description="inference: why it makes no rollouts for the version it "
                                        "holds (its record declares other rollout settings); empty when it does")
    metrics_url: str | None = None
    node_key: str | None = None
    trust_mode: Literal["keys", "open"] | None = Field(None, description="keys: versions and rounds only from the "
                                                      "trainer set; open: any peer announcing the trainer role")
    trainer_set: str | None = Field(None, description="what the trainer set is made of (configured, admitted, quorum)")
    evidence: list[EvidenceEntry] = Field(default_factory=list, description="members convicted of equivocation "
                                          "by evidence this node verified; refused for good")
    trust: list[TrustEntry] = Field(default_factory=list, description="trainer: the trust ledger after its last "
                                    "round (the keys that round named, then owing and convicted ones)")
    stopped: bool = Field(False, description="the node has stopped (its last status)")
    counters: NodeCounters = Field(default_factory=NodeCounters)
    trainer: TrainerCounters | None = None
    inference: InferenceCounters | None = None
    data_plane: DataPlane = Field(default_factory=DataPlane)
    standing: StandingReport = Field(default_factory=StandingReport)
    history: list[VersionEntry] = Field(default_factory=list)
    recent_errors: list[ErrorEntry] = Field(default_factory=list)

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    def held(self) -> dict[int, str]:
        """version -> state hash of every version in the history, and the one held now."""
        out = {h.version: h.state_hash for h in self.history}
        if self.version >= 0 and self.state_hash:
            out[self.version] = self.state_hash
        return out

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


class StatusFields(TypedDict, total=False):
    """The top-level fields a node sets with ``NodeStatus.update(**fields)``, by keyword: the type
    checker refuses a misspelt or mistyped one (``tests/test_ops_status_model.py`` keeps this
    equal to ``StatusReport``'s settable fields)."""

    updated_at: float
    version: int
    state_hash: str
    chain_hash: str
    lowest: int
    anchors: list[int]
    peers: int
    reward_mean: float | None
    eval_accuracy: float | None
    first_eval: EvalPoint | None
    contributors: int | None
    ranks: int | None
    rank_rss_mb: list[int]
    rank_peak_rss_mb: list[int]
    rollout_senders: dict[str, SenderReport]
    rollout_settings_error: str
    metrics_url: str | None
    node_key: str | None
    trust_mode: Literal["keys", "open"] | None
    trainer_set: str | None
    evidence: list[EvidenceEntry]
    trust: list[TrustEntry]
    stopped: bool
    standing: StandingReport


#: sections a node writes only through NodeStatus's typed methods (not ``update``)
SECTIONS = ("counters", "trainer", "inference", "data_plane", "history", "recent_errors")
ROLE_SECTIONS: dict[str, type[_Section]] = {"trainer": TrainerCounters, "inference": InferenceCounters}


def new_report(*, role: str, peer_id: str, run_id: str) -> StatusReport:
    """An empty report of a node that just started (its role's counter section present)."""
    return StatusReport(role=role, peer_id=peer_id, run_id=run_id,
                        trainer=TrainerCounters() if role == "trainer" else None,
                        inference=InferenceCounters() if role == "inference" else None)


def gauge_fields(report: StatusReport) -> Iterator[tuple[str, float, str]]:
    """(name, value, description) of every numeric or boolean field declared at the top level
    and in the node's sections: what ``/metrics`` exports as ``pulse_<name>``."""
    parts: list[pydantic.BaseModel] = [report, report.counters, report.data_plane]
    parts += [s for s in (report.trainer, report.inference) if s is not None]
    for part in parts:
        for name, info in type(part).model_fields.items():
            value = getattr(part, name)
            if isinstance(value, (bool, int, float)):
                yield info.alias or name, float(value), info.description or name


def parse_status(data: Any) -> StatusReport:
    """A status from JSON text/bytes or an already decoded object; ``StatusSchemaError`` if it
    is not JSON, not an object, of another schema version, or does not match the declaration."""
    if isinstance(data, (str, bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise StatusSchemaError(f"status is not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise StatusSchemaError(f"status is a JSON {type(data).__name__}, not an object")
    schema = data.get("schema")
    if schema is None:
        raise StatusSchemaError(f"status has no schema version (written by an older pulse-node); "
                                f"this pulse-node reads schema {STATUS_SCHEMA}")
    if schema != STATUS_SCHEMA:
        raise StatusSchemaError(f"status schema {schema!r}, this pulse-node reads schema {STATUS_SCHEMA}: "
                                "run the same pulse-node version on every node and tool")
    try:
        return StatusReport.model_validate(data)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise StatusSchemaError(f"status of schema {STATUS_SCHEMA} does not match its declaration "
                                f"({exc.error_count()} errors; first: {where}: {err['msg']})") from None


def read_status(path: Path) -> StatusReport | None:
    """The status a node wrote to ``path`` (None while there is none); ``StatusSchemaError``
    if the file is not a status this pulse-node can read."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    return parse_status(raw)
