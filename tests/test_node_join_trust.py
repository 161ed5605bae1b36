"""Safe by default: ``pulse-node join`` refuses to trust anyone on a real swarm unless told to,
trainers refuse to run outside the trainer set, and ``pulse-node swarm`` distributes keys."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import tomli_w

from pulse_node.chain.identity import Identity
from pulse_node.cli import main
from pulse_node.commands.join import OPEN_SWARM_BANNER, resolve_config, trust_gate
from pulse_node.config import ChainConfig, SwarmConfig
from pulse_node.errors import ConfigError

REMOTE = "/ip4/203.0.113.7/tcp/31337/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
LOCAL = "/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def _cfg(tmp_path: Path, *, role: str = "inference", bootstrap: str = REMOTE, open_swarm: bool = False,
         sets: tuple[str, ...] = ()):
    args = argparse.Namespace(role=role, config=None, overrides=list(sets), data_dir=str(tmp_path / role),
                              metrics_port=None, max_versions=None, bootstrap=[bootstrap], announce=[],
                              wire_announce=[], open_swarm=open_swarm)
    return resolve_config(args)


def test_join_on_a_remote_bootstrap_without_keys_refuses_before_starting_anything(tmp_path, capsys) -> None:
    code = main(["join", "--role", "inference", "--bootstrap", REMOTE, "--data-dir", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 1 and "no trainer keys are configured" in err and "--open-swarm-trust-anyone" in err
    assert not (tmp_path / "d" / "status.json").exists()  # nothing started


def test_the_open_swarm_flag_is_explicit_and_loud(tmp_path) -> None:
    assert trust_gate(_cfg(tmp_path, open_swarm=True)) == OPEN_SWARM_BANNER
    assert "OPEN SWARM" in OPEN_SWARM_BANNER
    local = trust_gate(_cfg(tmp_path, bootstrap=LOCAL))  # a local swarm may stay open, with a note
    assert local is not None and "no trainer keys" in local
    with pytest.raises(ValueError, match="cannot be combined"):
        ChainConfig(open_swarm=True, trusted_trainers=["ab" * 32])
    with pytest.raises(ValueError, match="not an Ed25519 public key"):
        ChainConfig(trusted_trainers=["trainer-0"])


def test_keyed_nodes_start_and_a_trainer_outside_the_set_refuses(tmp_path) -> None:
    member = Identity.load_or_create(tmp_path / "trainer" / "identity.key").public_key_hex
    other = Identity.generate().public_key_hex
    keys = f'chain.trusted_trainers=["{other}"]'
    assert trust_gate(_cfg(tmp_path, sets=(keys,))) is None
    with pytest.raises(ConfigError, match=f"this trainer's key {member} is not in the trainer set"):
        trust_gate(_cfg(tmp_path, role="trainer", sets=(keys,)))
    assert trust_gate(_cfg(tmp_path, role="trainer", sets=(f'chain.trusted_trainers=["{other}", "{member}"]',))) is None
    opened = trust_gate(_cfg(tmp_path, role="trainer", sets=(keys, "chain.open_trainers=true")))
    assert opened is not None and "joins as an open trainer" in opened  # a volunteer, said so
    keyfile = tmp_path / "keys.txt"
    keyfile.write_text(f"{other}\n{member}\n")
    assert trust_gate(_cfg(tmp_path, role="trainer", sets=(f"chain.trusted_trainers_path={keyfile}",))) is None


def test_local_swarm_creates_trainer_identities_first_and_every_node_trusts_exactly_them(tmp_path) -> None:
    from pulse_node.config import InferenceConfig, TrainerConfig
    from pulse_node.configload import load_config
    from pulse_node.swarm.launcher import LocalSwarm, node_config

    swarm = LocalSwarm(SwarmConfig(trainers=3, inference=2, run_dir=tmp_path / "run"), log=lambda m: None)
    keys = swarm.trainer_keys()
    on_disk = [Identity.load(tmp_path / "run" / f"trainer-{i}" / "identity.key").public_key_hex for i in range(3)]
    assert keys == on_disk and len(set(keys)) == 3
    for role, cls in (("trainer", TrainerConfig), ("inference", InferenceConfig)):
        name = "trainer-1" if role == "trainer" else "inference-0"
        conf = tmp_path / f"{name}.toml"
        conf.write_text(tomli_w.dumps(node_config(swarm.cfg, role=role, data_dir=tmp_path / "run" / name, trusted=keys)))
        cfg = load_config(cls, str(conf), [f'net.bootstrap=["{LOCAL}"]'])
        assert cfg.chain.trusted_trainers == keys and not cfg.chain.open_swarm
        assert trust_gate(cfg) is None  # keyed, and a trainer finds its own key in the set
