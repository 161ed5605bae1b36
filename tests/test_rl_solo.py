"""``run_solo`` and ``pulse-node solo``: a couple of steps end to end, JSON summary last."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import tiny_solo

from pulse_node.cli import main
from pulse_node.configload import load_config
from pulse_node.rl.config import SoloConfig
from pulse_node.rl.solo import run_solo

ROOT = Path(__file__).resolve().parents[1]


def test_run_solo_summary(warm_cache) -> None:
    cfg = tiny_solo(warm_cache, max_staleness=1).model_copy(update={"max_steps": 3, "sync_every": 2})
    out = run_solo(cfg, progress=False)
    assert out["steps"] == 3 and out["rollouts"] == 3 * 4 * 4
    for key in ("eval_before", "eval_after", "bf16_change_density"):
        assert 0.0 <= out[key] <= 1.0
    assert out["eval_problems"] == 20 and out["seconds"] > 0


def test_cli_json_last_line(warm_cache, capsys) -> None:
    args = ["solo", "--config", str(ROOT / "configs" / "solo.toml"), "--json", "--quiet",
            "--set", f'model.cache_dir="{warm_cache}"', "--set", "model.d_model=16",
            "--set", "model.n_layers=1", "--set", "grpo.warmstart_steps=2", "--set", "max_steps=1",
            "--set", "task.eval_size=30", "--set", "sampling.prompts_per_batch=2"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 1 and {"eval_before", "eval_after", "rollouts", "bf16_change_density",
                                     "seconds"} <= set(result)


def test_print_config_and_bad_override(capsys) -> None:
    assert main(["solo", "--config", str(ROOT / "configs" / "solo.toml"), "--print-config",
                 "--minutes", "2"]) == 0
    text = capsys.readouterr().out
    assert "minutes = 2.0" in text and "[grpo]" in text
    assert main(["solo", "--set", "grpo.eps_hi=1", "--print-config"]) == 1
    assert "grpo.eps_hi" in capsys.readouterr().err
    cfg = load_config(SoloConfig, ROOT / "configs" / "solo.toml")
    assert cfg.task.eval_size >= 200 and cfg.grpo.eps_low == 0.2 and cfg.grpo.eps_high == 0.28
