"""``pulse-node export``: versions rebuilt from a store load back into transformers bit-identically.

A store is filled in-process (signed records, patches, an anchor every 2 versions) from a
locally built Qwen2 model (tied embeddings) and from the embedded tiny model; the CLI exports
versions (anchor + patches, sharded or not) and ``AutoModelForCausalLM`` loads them.
"""

from __future__ import annotations

import json
import shutil

import pytest
import tomli_w
import torch

from pulse_node.chain.identity import Identity
from pulse_node.chain.store import VersionStore
from pulse_node.cli import main
from pulse_node.codec.statehash import state_hash
from pulse_node.config import ChainConfig
from pulse_node.rl.config import ModelConfig, task_config
from pulse_node.rl.policy import build_policy
from pulse_node.torchbits import module_state
from pulse_node.trainer.publisher import VersionPublisher
from tests.hf_fixtures import HF_TASK


def _fill_store(data_dir, model_cfg: ModelConfig, *, versions: int = 3) -> dict[int, str]:
    """Publish ``versions`` + 1 versions of the model with small perturbations; returns the hashes."""
    policy = build_policy(model_cfg, task_config(**HF_TASK), seed=0)
    params = dict(policy.model.named_parameters())
    gen = torch.Generator().manual_seed(0)
    hashes = {}
    with VersionStore(data_dir / "store") as store:
        pub = VersionPublisher(store, Identity.generate(), run_id="export-test", chain=ChainConfig(anchor_every=2))
        for v in range(versions + 1):
            with torch.no_grad():
                for p in params.values():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.01 * (v > 0))
            hashes[pub.publish(module_state(params.items())).record.version] = state_hash(module_state(params.items()))
    (data_dir / "node.toml").write_text(tomli_w.dumps({"role": "inference", "model": model_cfg.model_dump(
        mode="json", exclude_none=True)}))
    return hashes


def _loaded_hash(out) -> tuple[str, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    return state_hash(module_state(model.named_parameters())), model


@pytest.fixture(scope="module")
def hf_store(tmp_path_factory, hf_model_dir):
    data_dir = tmp_path_factory.mktemp("hf-node")
    return data_dir, _fill_store(data_dir, ModelConfig(kind="hf", path=str(hf_model_dir), device="cpu"))


@pytest.fixture(scope="module")
def hf_tokenizer(hf_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_model_dir)


def test_hf_versions_export_bit_identical(hf_store, hf_tokenizer, tmp_path, capsys) -> None:
    from transformers import AutoTokenizer

    data_dir, hashes = hf_store
    for version, extra in ((3, ["--version", "3"]), (1, ["--version", "1", "--max-shard-size", "20KB"]), (3, [])):
        out = tmp_path / f"v{version}-{len(extra)}"
        assert main(["export", "--data-dir", str(data_dir), "-o", str(out), *extra]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["version"] == version and summary["state_hash"] == hashes[version]
        got, model = _loaded_hash(out)
        assert got == hashes[version], f"v{version} loaded with other weights"
        assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, stored once
        sharded = (out / "model.safetensors.index.json").exists()
        assert sharded == ("20KB" in extra), sorted(p.name for p in out.iterdir())
        exported = AutoTokenizer.from_pretrained(out)
        assert type(exported) is type(hf_tokenizer) and exported("3+4=7")["input_ids"] == hf_tokenizer("3+4=7")["input_ids"]


def test_export_errors_leave_the_store_intact(hf_store, tmp_path, capsys) -> None:
    data_dir, _ = hf_store
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("mine")
    assert main(["export", "--data-dir", str(data_dir), "-o", str(busy)]) == 1
    assert "not an empty directory" in capsys.readouterr().err and (busy / "x").read_text() == "mine"
    assert main(["export", "--data-dir", str(data_dir), "--version", "9", "-o", str(tmp_path / "a")]) == 1
    assert "v9 is not in the store (it holds v0..v3)" in capsys.readouterr().err
    assert main(["export", "--data-dir", str(tmp_path / "nothing"), "-o", str(tmp_path / "b")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_export_of_a_version_the_store_cannot_rebuild(hf_store, tmp_path, capsys) -> None:
    data_dir, _hashes = hf_store
    broken = tmp_path / "node"
    shutil.copytree(data_dir, broken)
    (broken / "store" / "patches" / "3.patch").unlink()  # v3 = anchor 2 + patch 3
    before = sorted(p.relative_to(broken) for p in broken.rglob("*"))
    assert main(["export", "--data-dir", str(broken), "--version", "3", "-o", str(tmp_path / "out")]) == 1
    assert "cannot rebuild v3" in capsys.readouterr().err
    assert sorted(p.relative_to(broken) for p in broken.rglob("*")) == before and not (tmp_path / "out").exists()
    (broken / "store" / "patches" / "1.patch").write_bytes(b"garbage")  # corrupt: fails its digest
    assert main(["export", "--data-dir", str(broken), "--version", "1", "-o", str(tmp_path / "out")]) == 1
    assert "v1" in capsys.readouterr().err and (broken / "store" / "patches" / "1.patch").exists()


def test_export_refuses_a_model_dir_of_another_architecture(hf_store, tmp_path, capsys) -> None:
    data_dir, _ = hf_store
    config = tmp_path / "node.toml"
    config.write_text(tomli_w.dumps({"role": "inference", "model": {"kind": "tiny"}}))
    assert main(["export", "--data-dir", str(data_dir), "--config", str(config), "-o", str(tmp_path / "o")]) == 1
    assert "not a tiny-model state" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_tiny_model_exports_as_gpt2(tmp_path, capsys) -> None:
    """The embedded model becomes a GPT-2 with the same bits (transposed linears) and outputs."""
    from pulse_node.rl.hf_checkpoint import gpt2_name
    from pulse_node.rl.policy import build_tiny
    from pulse_node.rl.tokenizer import CharTokenizer

    model_cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, max_len=16)
    lm = build_tiny(model_cfg, seed=0, device=torch.device("cpu"))
    with VersionStore(tmp_path / "node" / "store") as store:
        rec = VersionPublisher(store, Identity.generate(), run_id="t", chain=ChainConfig()).publish(
            module_state(lm.module.named_parameters())).record
    (tmp_path / "node" / "node.toml").write_text(tomli_w.dumps({"role": "trainer", "model": model_cfg.model_dump(
        mode="json", exclude_none=True)}))
    assert main(["export", "--data-dir", str(tmp_path / "node"), "-o", str(tmp_path / "out")]) == 0
    assert json.loads(capsys.readouterr().out)["state_hash"] == rec.state_hash
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gpt2 = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    hf = dict(gpt2.named_parameters())
    for name, p in lm.module.named_parameters():
        q = hf[gpt2_name(name)]
        q = q.T if name.endswith(("qkv.weight", "proj.weight", "fc.weight", "out.weight")) else q  # Conv1D
        assert torch.equal(q, p.detach().to(torch.bfloat16).float()), name
    text = "12+34="
    ids = AutoTokenizer.from_pretrained(tmp_path / "out")(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == CharTokenizer().encode(text)
    with torch.no_grad():
        for p in lm.module.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        ours = lm.logits(ids, torch.ones_like(ids, dtype=torch.bool))
        torch.testing.assert_close(gpt2(ids).logits, ours, atol=1e-5, rtol=1e-5)
