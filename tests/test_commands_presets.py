"""What a new user runs first (issue 33): ``doctor --only model`` on every shipped preset (node,
swarm and solo configs) says PASS or a clear FAIL with the command that fixes it, never "a bug in
the check"; every command that loads a config takes ``--config``, ``--set`` and ``--print-config``;
``pulse-node swarm`` with a hub model that is not here fails at once, before any node starts, with
the ``hf download`` hint; and every preset's run dir is git-ignored. No hub access: the hub cache
is an empty folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pulse_node.cli import build_parser, main
from pulse_node.configload import read_toml

ROOT = Path(__file__).parents[1]
PRESETS = sorted((ROOT / "configs").glob("*.toml"))


@pytest.fixture
def empty_hub(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # relative model paths of the presets name nothing here
    return tmp_path


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_doctor_checks_the_model_of_every_shipped_preset(preset, empty_hub, capsys) -> None:
    code = main(["doctor", "--config", str(preset), "--only", "model", "--json"])
    (check,) = json.loads(capsys.readouterr().out)
    model = read_toml(preset).get("model", {})
    if model.get("kind") != "hf":
        assert (code, check["status"]) == (0, "PASS"), check
        return
    assert (code, check["status"]) == (1, "FAIL") and "bug in the check" not in check["fix"], check
    if "/" in model["path"] and not model["path"].startswith("."):  # a hub id
        assert check["fix"].startswith(f"hf download {model['path']}"), check
    else:
        assert "model directory not found" in check["detail"], check


def test_a_missing_hub_model_stops_the_swarm_before_any_node_starts(empty_hub, capsys) -> None:
    run_dir = empty_hub / "run"
    code = main(["swarm", "--config", str(ROOT / "configs/qwen2.5-0.5b-gsm8k-swarm.toml"), "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 1 and "hf download Qwen/Qwen2.5-0.5B-Instruct" in err, err
    assert not run_dir.exists(), "nodes were started"


def _subcommands(parser: argparse.ArgumentParser, path: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{path} {name}".strip())
    yield path, {opt for a in parser._actions for opt in a.option_strings}


def test_every_command_that_loads_a_config_takes_set_and_print_config() -> None:
    loading = {path: opts for path, opts in _subcommands(build_parser()) if "--config" in opts}
    assert {"swarm", "join", "solo", "doctor", "rollouts make", "rollouts check"} <= set(loading)
    assert {path for path, opts in loading.items() if not {"--set", "--print-config"} <= opts} == set()


def test_every_presets_run_dir_is_git_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().split()
    for preset in PRESETS:
        tree = read_toml(preset)
        for key in ("run_dir", "data_dir"):
            if key in tree:
                assert f"/{Path(tree[key]).parts[0]}/" in ignored, f"{preset.name}: {key} {tree[key]} is not git-ignored"
