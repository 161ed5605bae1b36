"""Model sources: hub ids through the local HF cache only, identity digests, the chat-template
choice, the doctor's model report, and the model bound into the signed rollout settings."""

from __future__ import annotations

import json

import pytest

from pulse_node.errors import DataError
from pulse_node.rl.config import ModelConfig, SamplingConfig, task_config
from pulse_node.rl.model_source import (
    model_identity,
    model_report,
    resolve_model,
    use_chat_template,
)
from pulse_node.rl.settings import ModelMismatch, check_declared_model, check_settings, rollout_settings
from pulse_node.testing.hf_cache import put_in_hub_cache

A, B = "a" * 40, "b" * 40


def fake_model(folder, *, template: bool = True, vocab: str = "x") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    cfg = {"eos_token": "<e>", **({"chat_template": "{{ messages }}"} if template else {})}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "vocab.json").write_text(json.dumps({vocab: 0}))


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    fake_model(tmp_path / "m")
    put_in_hub_cache(tmp_path / "m", tmp_path / "home" / "hub", "Org/M-Instruct", commit=B, ref=None)
    put_in_hub_cache(tmp_path / "m", tmp_path / "home" / "hub", "Org/M-Instruct", commit=A)
    return tmp_path


def test_hub_id_resolves_in_the_cache_main_or_a_pinned_revision(cache) -> None:
    main = resolve_model("Org/M-Instruct")
    assert main.hub_id == "Org/M-Instruct" and main.revision == A and (main.path / "config.json").is_file()
    assert resolve_model("Org/M-Instruct", revision=B).revision == B
    again = resolve_model(str(main.path))  # a snapshot directory is known by its id and commit
    assert (again.hub_id, again.revision) == ("Org/M-Instruct", A)
    plain = resolve_model(str(cache / "m"))
    assert plain.hub_id == "" and plain.revision == "" and model_identity(plain)["digest"] == model_identity(main)["digest"]


def test_hf_hub_cache_wins_over_hf_home(cache, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(cache / "elsewhere"))
    with pytest.raises(DataError, match="elsewhere"):
        resolve_model("Org/M-Instruct")


def test_uncached_model_says_how_to_fetch_it(cache) -> None:
    with pytest.raises(DataError) as err:
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    msg = str(err.value)
    assert "not in the local Hugging Face cache" in msg and "hf download Qwen/Qwen2.5-0.5B-Instruct" in msg
    assert "huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct" in msg
    with pytest.raises(DataError, match="--revision " + "c" * 40):
        resolve_model("Org/M-Instruct", revision="c" * 40)
    with pytest.raises(DataError, match="model directory not found"):
        resolve_model("./no/such/../dir")


def test_digest_covers_config_and_tokenizer_files(tmp_path) -> None:
    fake_model(tmp_path / "a")
    fake_model(tmp_path / "b", vocab="y")
    da, db = (model_identity(resolve_model(str(tmp_path / n)))["digest"] for n in "ab")
    assert da != db and len(da) == 64


def test_chat_template_default_and_overrides(cache) -> None:
    instruct = resolve_model("Org/M-Instruct")
    assert use_chat_template(None, instruct) and not use_chat_template(False, instruct)
    fake_model(cache / "base-model")
    base = resolve_model(str(cache / "base-model"))
    assert not use_chat_template(None, base) and use_chat_template(True, base)
    fake_model(cache / "chat-less-instruct", template=False)
    bare = resolve_model(str(cache / "chat-less-instruct"))
    assert not use_chat_template(None, bare)
    with pytest.raises(DataError, match="no chat template"):
        use_chat_template(True, bare)


def test_doctor_model_report(cache) -> None:
    ok, detail, _ = model_report("Org/M-Instruct", revision=None, chat_setting=None)
    assert ok and f"Org/M-Instruct revision {A}" in detail and "chat template on" in detail
    ok, detail, fix = model_report("Org/Missing", revision=None, chat_setting=None)
    assert not ok and "not in the local Hugging Face cache" in detail and fix.startswith("hf download Org/Missing")


def _settings(revision: str | None, **task) -> str:
    return rollout_settings(sampling=SamplingConfig(max_new_tokens=2048), task=task_config(**task),
                            batches_per_version=2, model=ModelConfig(kind="hf", path="Org/M-Instruct", revision=revision))


def test_model_bound_in_settings_and_other_revision_refused(cache) -> None:
    ours, theirs = _settings(B), _settings(None)
    body = json.loads(theirs)
    assert body["model"]["revision"] == A and body["model"]["chat"] is True and body["max_new_tokens"] == 2048
    with pytest.raises(ModelMismatch) as err:
        check_settings(theirs, ours, version=3)
    assert f"made with model Org/M-Instruct revision {A}" in str(err.value)
    assert f"this node loads Org/M-Instruct revision {B}" in str(err.value)
    with pytest.raises(ModelMismatch):
        check_declared_model(theirs, ours, version=3)  # what a trainer checks before adopting a peer's state
    check_settings(theirs, _settings(None), version=3)
    # a local copy of the same files (no revision known) agrees with the swarm when it renders the same way
    def local(chat: bool | None) -> str:
        return rollout_settings(sampling=SamplingConfig(max_new_tokens=2048), task=task_config(chat_template=chat),
                                batches_per_version=2, model=ModelConfig(kind="hf", path=str(cache / "m")))

    check_settings(theirs, local(True), version=3)
    with pytest.raises(ModelMismatch):  # "m" has no instruct name: the template is off by default
        check_settings(theirs, local(None), version=3)


def test_system_prompt_bound_by_digest(cache) -> None:
    a = json.loads(_settings(None, system_prompt="Reason step by step, then answer after ####."))
    b = json.loads(_settings(None))
    assert len(a["task"]["system_prompt"]) == 64 and "system_prompt" not in b["task"]


def test_doctor_reports_the_model_of_a_node_config(cache) -> None:
    from pulse_node.commands.doctor import model_check

    toml = cache / "node.toml"
    toml.write_text('role = "inference"\n[model]\nkind = "hf"\npath = "Org/M-Instruct"\n')
    check = model_check(str(toml))()
    assert check.status == "PASS" and f"Org/M-Instruct revision {A} at " in check.detail
    toml.write_text('role = "trainer"\n[model]\nkind = "hf"\npath = "Org/M-Instruct"\nrevision = "' + "c" * 40 + '"\n')
    check = model_check(str(toml))()
    assert check.status == "FAIL" and check.fix.startswith("hf download Org/M-Instruct --revision " + "c" * 40)
