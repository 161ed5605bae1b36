"""Rollout settings declared in signed version records: canonical, complete, and explained when they differ."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pulse_node.chain.identity import Identity
from pulse_node.chain.record import decode_record, encode_record, make_record, verify_record
from pulse_node.errors import WireError
from pulse_node.rl.config import SamplingConfig, task_config
from pulse_node.rl.settings import (
    ModelMismatch,
    SettingsMismatch,
    check_declared_model,
    check_settings,
    rollout_settings,
)


def settings(**sampling) -> str:
    return rollout_settings(sampling=SamplingConfig(**sampling), task=task_config(), batches_per_version=16)


def test_settings_are_canonical_and_cover_what_rollouts_depend_on() -> None:
    s = json.loads(settings())
    assert settings() == settings() and " " not in settings()
    assert {"sampler", "temperature", "max_new_tokens", "group_size", "prompts_per_batch",
            "batches_per_version", "task"} <= set(s)
    assert s["task"]["reward"] == "exact" and s["task"]["digits"] == 2
    for change in ({"temperature": 0.7}, {"max_new_tokens": 9}, {"group_size": 4}, {"prompts_per_batch": 3}):
        assert settings(**change) != settings()


def test_jsonl_task_is_named_by_its_contents_not_its_path(tmp_path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    b.write_text(a.read_text())
    same = [rollout_settings(sampling=SamplingConfig(), task=task_config(kind="jsonl", path=str(p)), batches_per_version=1)
            for p in (a, b)]
    assert same[0] == same[1] and str(a) not in same[0]
    b.write_text('{"prompt": "1+1=", "answer": "3"}\n')
    assert rollout_settings(sampling=SamplingConfig(), task=task_config(kind="jsonl", path=str(b)),
                            batches_per_version=1) != same[0]


def test_mismatch_names_the_differences() -> None:
    check_settings(settings(), settings(), version=3)
    with pytest.raises(SettingsMismatch, match=r"version 3 .*temperature: version 0\.7 vs config 1\.0"):
        check_settings(settings(temperature=0.7), settings(), version=3)
    with pytest.raises(SettingsMismatch, match="declares no rollout settings"):
        check_settings("", settings(), version=3)


def test_settings_travel_signed_in_the_record() -> None:
    ident = Identity.generate()
    rec = make_record(ident, run_id="r", version=0, parent=None, state_hash="00" * 32, patch=None,
                      anchor_version=0, is_anchor=True, codec="anchor/safetensors", rollout_settings=settings())
    back = decode_record(encode_record(rec))
    verify_record(back, trusted_signers={ident.public_key_hex}, run_id="r")
    assert back.rollout_settings == settings()
    with pytest.raises(ValueError, match="rollout_settings"):
        make_record(ident, run_id="r", version=0, parent=None, state_hash="00" * 32, patch=None,
                    anchor_version=0, is_anchor=True, codec="anchor/safetensors", rollout_settings="x" * 1025)
    with pytest.raises(WireError, match="rollout_settings"):
        decode_record(encode_record(dataclasses.replace(rec, rollout_settings="tab\there")))


@pytest.mark.parametrize("declared", ["", "not json", "[1, 2]", "3", '"a string"', "{" * 5000],
                         ids=["empty", "not-json", "list", "number", "string", "deep"])
def test_a_state_declaring_no_readable_settings_is_not_adopted(declared: str) -> None:
    """Issue 34 item 5: a trainer adopting a peer's state refuses one whose record declares no
    settings it can read (before, empty or non-JSON settings passed unchecked), whatever model it
    loads itself; readable settings naming our model pass."""
    for mine in (settings(), json.dumps({**json.loads(settings()), "model": {"digest": "d" * 64, "chat": False}})):
        with pytest.raises(ModelMismatch, match="rollout settings"):
            check_declared_model(declared, mine, version=7)
        check_declared_model(mine, mine, version=7)
    check_declared_model(settings(temperature=0.5), settings(), version=7)  # other sampling: not the model's business
