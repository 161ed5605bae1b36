"""Every config file in the repo loads into its role's config class, and overrides work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pulse_node.config import InferenceConfig, SwarmConfig, TrainerConfig, load_node_config
from pulse_node.configload import dump_toml, load_config, read_toml
from pulse_node.errors import ConfigError
from pulse_node.rl.config import SoloConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


def load_any(path: Path):
    tree = read_toml(path)
    if "role" in tree:
        return load_node_config(path)
    return load_config(SwarmConfig if "trainers" in tree or path.stem == "swarm" else SoloConfig, path)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_loads(path):
    cfg, tree = load_any(path), read_toml(path)
    assert "role" not in tree or cfg.role == tree["role"]
    again = load_config(type(cfg), None, [])  # defaults also valid
    assert again is not None
    assert dump_toml(cfg)


def test_expected_config_files_exist():
    names = {p.name for p in CONFIGS}
    assert {"swarm.toml", "trainer.toml", "inference.toml", "solo.toml"} <= names


def test_overrides_win_over_file_and_unknown_keys_fail(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('role = "trainer"\n[grpo]\nlr = 1e-3\n')
    cfg = load_config(TrainerConfig, f, ["grpo.lr=3e-6", "net.bootstrap=['/ip4/1.2.3.4/tcp/1']"])
    assert cfg.grpo.lr == 3e-6 and cfg.net.bootstrap == ["/ip4/1.2.3.4/tcp/1"]
    with pytest.raises(ConfigError, match="grpo.lrr"):
        load_config(TrainerConfig, f, ["grpo.lrr=1"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(TrainerConfig, tmp_path / "missing.toml")


def test_a_node_config_is_the_variant_its_role_names(tmp_path):
    """One ``RoleConfig`` union: ``role`` picks the class; a trainer's keys on an inference node fail."""
    f = tmp_path / "n.toml"
    f.write_text('role = "trainer"\n[loco]\nmax_payload_bytes = 4096\n')
    assert type(load_node_config(f)) is TrainerConfig and load_node_config(f).loco.max_payload_bytes == 4096
    assert type(load_node_config(None)) is InferenceConfig  # no role anywhere: inference
    assert type(load_node_config(None, ["role=\"trainer\""])) is TrainerConfig
    with pytest.raises(ConfigError, match="loco"):
        load_node_config(f, role="inference")
    with pytest.raises(ConfigError, match="role"):
        load_node_config(None, ["role=\"oracle\""])
    with pytest.raises(ConfigError, match=r"n\.toml: grpo\.lrr"):
        load_node_config(f, ["grpo.lrr=1"])  # the variant tag does not lead the error's key


def test_a_setting_is_declared_once():
    """``SwarmConfig`` and the role configs share settings by inheritance, never by re-declaring
    them: no class declares a field that one of its bases already declares."""
    from pulse_node.config import NodeConfig, SharedSettings, TrainingSettings

    for cls in (SharedSettings, TrainingSettings, NodeConfig, TrainerConfig, InferenceConfig, SwarmConfig):
        own = set(cls.__annotations__) - {"model_config"}
        inherited = {f for base in cls.__mro__[1:] for f in getattr(base, "model_fields", {})}
        assert not own & inherited, f"{cls.__name__} re-declares {sorted(own & inherited)}"
    assert set(SharedSettings.model_fields) <= set(SwarmConfig.model_fields) & set(InferenceConfig.model_fields)
    assert set(TrainingSettings.model_fields) <= set(SwarmConfig.model_fields) & set(TrainerConfig.model_fields)


def test_cli_help_is_fast_and_does_not_import_torch():
    code = "import sys; from pulse_node.cli import main\n" \
           "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n" \
           "bad = [m for m in ('torch', 'hivemind', 'libp2p') if m in sys.modules]\n" \
           "assert not bad, bad"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "swarm" in out.stdout and "join" in out.stdout


def test_print_config_shows_resolved_values():
    out = subprocess.run([sys.executable, "-m", "pulse_node", "join", "--role", "trainer",
                          "--set", "grpo.lr=3e-6", "--print-config"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "lr = 3e-06" in out.stdout and 'role = "trainer"' in out.stdout


def test_an_announced_address_needs_a_fixed_listen_port():
    """With port 0 (the default) the node listens on a random port, so no announced port can be
    right: `join --announce` / `--wire-announce` must come with the forwarded listen port."""
    from pulse_node.config import InferenceConfig

    for announce, listen in (("net.announce", "net.dht_listen"), ("net.wire_announce", "net.wire_listen")):
        with pytest.raises(ConfigError, match=f"{listen} on a fixed port"):
            load_config(InferenceConfig, None, [f"{announce}=['/ip4/1.2.3.4/tcp/31338']"])
        cfg = load_config(InferenceConfig, None, [f"{announce}=['/ip4/1.2.3.4/tcp/31338']",
                                                  f"{listen}=['/ip4/0.0.0.0/tcp/31338']"])
        assert getattr(cfg.net, announce.split(".")[1]) == ["/ip4/1.2.3.4/tcp/31338"]
    assert load_config(InferenceConfig, None, []).net.announce == []  # no announcement: port 0 is fine


def test_solo_refuses_a_sync_interval_whose_rollouts_it_would_drop():
    """With sync_every = k solo's rollouts are up to k - 1 versions old: a smaller staleness bound
    would silently drop them all, so the config says what to raise instead."""
    with pytest.raises(ConfigError, match="grpo.max_staleness"):
        load_config(SoloConfig, None, ["sync_every=3"])
    assert load_config(SoloConfig, None, ["sync_every=3", "grpo.max_staleness=2"]).sync_every == 3


def test_realistic_preset_shares_the_default_warm_start():
    """configs/realistic.toml changes how the swarm trains, not the model or task: its nodes load
    the warm start the default swarm cached (no second warm start for a user)."""
    from pulse_node.rl.warmstart_key import cache_key

    keys = set()
    for cfg in (load_config(SwarmConfig, None), load_config(SwarmConfig, ROOT / "configs" / "realistic.toml")):
        keys.add(cache_key(cfg.task.model_dump(mode="json"), cfg.model, cfg.grpo, cfg.seed))
    assert len(keys) == 1
