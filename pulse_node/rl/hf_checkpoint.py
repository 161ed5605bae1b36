"""A version as a Hugging Face checkpoint directory (what ``pulse-node export`` writes).

The directory holds ``config.json``, the tokenizer files and the version's BF16 weights as
safetensors in the HF layout (``model.safetensors``, or ``model-0000k-of-0000n.safetensors``
plus ``model.safetensors.index.json`` above ``max_shard_size``), so
``AutoModelForCausalLM.from_pretrained(out)`` loads weights bit-identical to the version.

- A run from an HF model (``model.kind = "hf"``, a directory or a cached hub id): the versioned State already uses the
  model's parameter names (a tied head is one tensor, which the HF layout omits too), so the
  weights are written as they are; ``config.json`` comes from ``model.path`` with
  ``dtype = bfloat16`` (the version's precision), every other non-weight file (tokenizer,
  generation config, chat template) is copied unchanged.
- The embedded tiny model is exactly a GPT-2 (pre-LN blocks, learned positions, exact GELU,
  LayerNorm eps 1e-5, tied embeddings, fused q/k/v in head order), so it is written as a
  ``GPT2LMHeadModel``: tensors renamed, the four linear weights per block transposed (GPT-2's
  ``Conv1D`` stores ``[in, out]``), same bits; its character tokenizer becomes a ``tokenizers``
  WordLevel tokenizer with the same ids (BOS prepended, as the node encodes prompts).

Before anything is written the State is checked against the architecture the config
describes (parameter names and shapes of the model built on the meta device).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pulse_node.codec.state import State, TensorBits, to_safetensors_bytes
from pulse_node.errors import DataError
from pulse_node.fsutil import write_atomic
from pulse_node.rl.config import ModelConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

DEFAULT_MAX_SHARD = "5GB"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
INDEX_FILE = "model.safetensors.index.json"


def write_checkpoint(out: Path, state: State, *, model_cfg: ModelConfig,
                     max_shard_size: int | str = DEFAULT_MAX_SHARD, metadata: dict[str, str] | None = None) -> list[str]:
    """Write ``state`` as an HF checkpoint into the new directory ``out``; returns its file names.

    Written into a temporary sibling first and renamed, so ``out`` is either complete or absent.
    """
    if model_cfg.kind == "hf":
        from pulse_node.rl.model_source import resolve_model

        source = resolve_model(model_cfg.path or "", revision=model_cfg.revision)
        config, weights, copy_from = _hf_layout(state, source.path)
    else:
        config, weights, copy_from = _gpt2_layout(state, model_cfg), _gpt2_weights(state), None
    check_architecture(config, weights)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if copy_from is not None:
            _copy_non_weights(copy_from, tmp)
        else:
            _tiny_tokenizer().save_pretrained(tmp)
        write_atomic(tmp / "config.json", (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
        write_weights(tmp, weights, max_shard_size=max_shard_size, metadata=metadata)
        os.replace(tmp, out)  # an existing empty ``out`` is replaced, a non-empty one refused earlier
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(p.name for p in out.iterdir())


def write_weights(folder: Path, weights: State, *, max_shard_size: int | str,
                  metadata: dict[str, str] | None = None) -> None:
    """Safetensors shards named and indexed the way ``transformers`` saves them."""
    from huggingface_hub import split_state_dict_into_shards_factory

    split = split_state_dict_into_shards_factory(weights, get_storage_size=lambda t: t.nbytes,
                                                 filename_pattern="model{suffix}.safetensors",
                                                 max_shard_size=max_shard_size)
    meta = {"format": "pt", **(metadata or {})}  # transformers refuses safetensors without format=pt
    for filename, names in split.filename_to_tensors.items():
        write_atomic(folder / filename, to_safetensors_bytes({n: weights[n] for n in sorted(names)}, meta))
    if split.is_sharded:
        index = {"metadata": {**split.metadata, **(metadata or {})}, "weight_map": dict(sorted(split.tensor_to_filename.items()))}
        write_atomic(folder / INDEX_FILE, (json.dumps(index, indent=2) + "\n").encode())


def check_architecture(config: dict[str, Any], weights: State) -> None:
    """``DataError`` unless ``weights`` are exactly the parameters of the model ``config`` describes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "transformers_version"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # transformers raises assorted types for configs it cannot build
        raise DataError(f"cannot build the model config.json describes ({type(exc).__name__}: {exc}), "
                        "so the version cannot be checked against it") from None
    want = {n: tuple(p.shape) for n, p in model.named_parameters()}
    have = {n: tuple(t.shape) for n, t in weights.items()}
    if want != have:
        diff = sorted(set(want) ^ set(have)) or sorted(n for n in want if want[n] != have[n])
        raise DataError(f"the version's tensors do not fit the {cfg.model_type} config (e.g. {', '.join(diff[:3])}); "
                        "is model.path the model this run started from?")


# ---- a run from a local HF model --------------------------------------------------------
def _hf_layout(state: State, model_dir: Path) -> tuple[dict[str, Any], State, Path]:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read the model config ({exc})") from None
    config.update(dtype="bfloat16", torch_dtype="bfloat16")  # the version's precision (v4 and v5 keys)
    return config, state, model_dir


def _copy_non_weights(src: Path, dst: Path) -> None:
    """Tokenizer, generation config, chat template...: every file of ``src`` but weights and config."""
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and f.name not in (INDEX_FILE, "config.json") \
                and not f.name.endswith(".index.json"):
            shutil.copyfile(f, dst / f.name)


# ---- the embedded tiny model as GPT-2 --------------------------------------------------
_TRANSPOSED = ("qkv", "proj", "fc", "out")  # nn.Linear [out, in] -> GPT-2 Conv1D [in, out]
_BLOCK_NAMES = {"ln1": "ln_1", "ln2": "ln_2", "qkv": "attn.c_attn", "proj": "attn.c_proj",
                "fc": "mlp.c_fc", "out": "mlp.c_proj"}


def gpt2_name(name: str) -> str:
    """The GPT-2 name of a tiny-model parameter."""
    top = {"tok_emb.weight": "transformer.wte.weight", "pos_emb.weight": "transformer.wpe.weight",
           "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
    if name in top:
        return top[name]
    _, i, layer, leaf = name.split(".")  # blocks.<i>.<layer>.<weight|bias>
    return f"transformer.h.{i}.{_BLOCK_NAMES[layer]}.{leaf}"


def _gpt2_weights(state: State) -> State:
    out: State = {}
    for name, t in state.items():
        if name.split(".")[-2] in _TRANSPOSED and name.endswith(".weight"):
            bits = np.ascontiguousarray(t.bits.reshape(t.shape).T).reshape(-1)
            t = TensorBits(t.dtype, (t.shape[1], t.shape[0]), bits)
        out[gpt2_name(name)] = t
    return out


def _gpt2_layout(state: State, model_cfg: ModelConfig) -> dict[str, Any]:
    from pulse_node.rl.tokenizer import CharTokenizer

    try:
        vocab, d = state["tok_emb.weight"].shape
        n_layers = 1 + max(int(n.split(".")[1]) for n in state if n.startswith("blocks."))
        positions = state["pos_emb.weight"].shape[0]
    except (KeyError, ValueError) as exc:
        raise DataError(f"the version is not a tiny-model state ({exc}); set model.kind/model.path "
                        "to the model this run used") from None
    if d % model_cfg.n_heads:
        raise DataError(f"model.n_heads={model_cfg.n_heads} does not divide the version's width {d}")
    tok = CharTokenizer()
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab, "n_embd": d,
            "n_layer": n_layers, "n_head": model_cfg.n_heads, "n_positions": positions, "n_inner": 4 * d,
            "activation_function": "gelu", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attn_pdrop": 0.0, "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id,
            "tie_word_embeddings": True, "dtype": "bfloat16", "torch_dtype": "bfloat16"}


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer as a ``PreTrainedTokenizerFast`` with the same ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from pulse_node.rl.tokenizer import CharTokenizer

    chars = CharTokenizer()
    pad, bos, eos = chars.SPECIALS
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(chars.itos)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")  # every character
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, chars.bos_id)])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad)
