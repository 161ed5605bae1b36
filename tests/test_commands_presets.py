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


def test_the_swarms_join_hint_is_a_command_join_accepts(tmp_path) -> None:
    """On loopback the hint says how to make the swarm reachable; on a reachable host it is a
    ``pulse-node join`` command that passes join's trust gate from another machine (the trainers'
    keys, the run id), which the old hint (no keys) did not."""
    import shlex

    from pulse_node.commands.join import resolve_config, trust_gate
    from pulse_node.config import SwarmConfig
    from pulse_node.swarm.launcher import LocalSwarm
    from pulse_node.swarm.view import join_hint

    local = LocalSwarm(SwarmConfig(run_dir=tmp_path), log=lambda m: None)
    assert "--set host=" in join_hint(local)
    swarm = LocalSwarm(SwarmConfig(run_dir=tmp_path, host="10.1.2.3", run_id="lab-1"), log=lambda m: None)
    swarm.bootstrap_addr, swarm.trusted = "/ip4/10.1.2.3/tcp/4001/p2p/12D3KooWX", ["ab" * 32, "cd" * 32]
    argv = shlex.split(join_hint(swarm).split(": ", 1)[1])
    assert argv[:2] == ["pulse-node", "join"]
    args = build_parser().parse_args([*argv[1:], "--data-dir", str(tmp_path / "remote")])
    cfg = resolve_config(args)
    assert cfg.chain.trusted_trainers == swarm.trusted and cfg.run_id == "lab-1"
    assert trust_gate(cfg) is None  # no ConfigError, no open-swarm banner
    old = build_parser().parse_args(["join", "--bootstrap", swarm.bootstrap_addr, "--role", "inference"])
    with pytest.raises(Exception, match="no trainer keys"):
        trust_gate(resolve_config(old))
