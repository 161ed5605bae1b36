"""Every decoder of a peer's bytes ends every input in a typed refusal or a decode (issue 34).

The fast lane's share of ``bench/fuzz.py``: each registered decoder
(``pulse_node/testing/fuzz_targets.py``) gets its real samples and a few hundred blind mutations
of them (the bench runs them coverage-guided, for minutes), and every input a fuzzing run found
crashing a decoder (``tests/fuzz_regressions/<target>/*.bin``) is refused now.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pulse_node.testing.fuzz_targets import TARGETS, mutations, run_one

REGRESSIONS = Path(__file__).resolve().parent / "fuzz_regressions"
MUTATIONS = 150


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_decoder_refuses_what_it_cannot_read_with_a_typed_error(name: str) -> None:
    target = TARGETS[name]
    seeds = target.seeds()
    assert seeds and all(run_one(target, s).kind != "crash" for s in seeds)
    assert any(run_one(target, s).kind == "decoded" for s in seeds), f"{name}: no real sample decodes"
    crashes = [o.signature for d in mutations(seeds, count=MUTATIONS, rng=random.Random(name))
               if (o := run_one(target, d)).kind == "crash"]
    assert not crashes, f"{name}: {len(crashes)} inputs crashed the decoder, e.g. {crashes[0]}"


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*/*.bin")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_what_a_fuzzing_run_found_crashing_is_refused_now(path: Path) -> None:
    outcome = run_one(TARGETS[path.parent.name], path.read_bytes())
    assert outcome.kind != "crash", outcome.detail


def test_every_decoder_of_peer_bytes_is_registered() -> None:
    assert {"version_record", "patch_compact", "patch_overwrite", "patch_context", "patch_inplace", "patch_streamed",
            "loco_payload", "round_decision", "admission", "evidence", "rollout_batch", "status_record", "dht_entry",
            "rpc_request", "rpc_reply", "wire_frame", "anchor_header", "anchor_state", "inner_commitment",
            "inner_opening", "spot_evidence", "statement"} <= set(TARGETS)
    assert {p.name for p in REGRESSIONS.iterdir() if p.is_dir()} <= set(TARGETS)
