"""The micro-batched, chunked, checkpointed GRPO update equals the single big step.

The reference is the learner's original algorithm written out: the whole batch packed, the
model's full logits on the straight-through BF16 weights, the token mean of the clipped
surrogate over every completion token, one backward, clipping, AdamW.
"""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest
import torch

from pulse_node.rl.batch import bf16_params, masked_mean, pack, token_logprobs
from pulse_node.rl.config import GRPOConfig, ModelConfig, task_config
from pulse_node.rl.grpo import GRPOLearner, group_advantages, micro_batches
from pulse_node.rl.models import HFLM
from pulse_node.rl.policy import Policy, build_tiny
from pulse_node.rl.rollout import Rollout
from pulse_node.rl.tokenizer import CharTokenizer

MICRO = {"micro_batch_tokens": 40, "logit_chunk_tokens": 7, "activation_checkpointing": True}


def tiny_policy() -> Policy:
    lm = build_tiny(ModelConfig(d_model=32, n_layers=2, n_heads=2, max_len=48), seed=3, device=torch.device("cpu"))
    return Policy(lm, CharTokenizer(), task_config(), torch.device("cpu"))


def llama_policy() -> Policy:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=1)
    return Policy(HFLM(LlamaForCausalLM(cfg), 64), SimpleNamespace(vocab_size=40, pad_id=0), task_config(),
                  torch.device("cpu"))


def batch(policy: Policy, *, rows: int = 12, seed: int = 0) -> list[Rollout]:
    """Rows of different lengths, behaviour log-probs near the model's (some ratios clipped)."""
    rng = random.Random(seed)
    vocab = policy.tokenizer.vocab_size
    out = []
    for i in range(rows):
        prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(2, 6))]
        completion = [rng.randrange(2, vocab) for _ in range(rng.randint(1, 14))]
        out.append(Rollout(prompt, completion, [0.0] * len(completion), float(i % 2), 0,
                           f"p{i // 4}", f"g{i // 4}", local=True))
    packed = pack([(r.prompt_ids, r.completion_ids) for r in out], pad_id=policy.tokenizer.pad_id,
                  device=policy.device)
    with torch.no_grad():
        lp = token_logprobs(policy.lm, packed)[packed.target].tolist()
    for r in out:
        r.logprobs = [x + rng.gauss(0.0, 0.3) for x in lp[:len(r.completion_ids)]]
        lp = lp[len(r.completion_ids):]
    return out


def reference_loss(policy: Policy, rollouts: list[Rollout], adv: list[float], cfg: GRPOConfig) -> torch.Tensor:
    packed = pack([(r.prompt_ids, r.completion_ids) for r in rollouts], pad_id=policy.tokenizer.pad_id,
                  device=policy.device)
    new_lp = token_logprobs(policy.lm, packed, params=bf16_params(policy.model))
    old_lp = torch.zeros_like(new_lp)
    for i, r in enumerate(rollouts):
        start = len(r.prompt_ids) - 1
        old_lp[i, start:start + len(r.logprobs)] = torch.tensor(r.logprobs)
    a = torch.tensor(adv)[:, None]
    ratio = torch.exp((new_lp - old_lp).clamp(-20, 20))
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    return masked_mean(-torch.minimum(ratio * a, clipped * a), packed.target)


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _checkpointed(model: torch.nn.Module) -> bool:
    """Whether any layer of ``model`` recomputes its activations (the flag transformers sets on each
    checkpointed decoder layer; read directly, not through a deprecated property)."""
    return any(getattr(m, "gradient_checkpointing", None) is True for m in model.modules())


@pytest.mark.parametrize("make", [tiny_policy, llama_policy], ids=["tiny", "llama"])
def test_micro_batched_step_equals_the_single_big_step(make) -> None:
    big, small = make(), make()
    small.model.load_state_dict(big.model.state_dict())
    rollouts = batch(big)
    cfg = GRPOConfig(lr=1e-3, **MICRO)
    assert not _checkpointed(small.model)
    learner = GRPOLearner(small, cfg)
    assert _checkpointed(small.model) == isinstance(small.lm, HFLM), "an HF model checkpoints its decoder layers"
    kept = [(r, a) for r, a in zip(rollouts, group_advantages(rollouts)) if a != 0.0]
    assert len(micro_batches([r for r, _ in kept], budget=cfg.micro_batch_tokens)) >= 3  # really accumulates

    big.model.train()
    loss = reference_loss(big, [r for r, _ in kept], [a for _, a in kept], cfg)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(big.model.parameters(), cfg.max_grad_norm)
    ref = grads(big.model)
    stats = learner.step(copy.deepcopy(rollouts), current_version=0)
    got = grads(small.model)  # clipped, as the reference's
    assert stats["stepped"] == 1.0 and stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    assert stats["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    assert 0.0 < stats["clip_frac"] < 1.0 and stats["tokens"] == sum(len(r.completion_ids) for r, _ in kept)
    assert set(got) == set(ref)
    for n in ref:  # FP32 sums in another order: 1e-5 of the gradient's scale
        torch.testing.assert_close(got[n], ref[n], rtol=1e-4, atol=1e-5 * float(ref[n].abs().max()) + 1e-9)

    opt = torch.optim.AdamW(big.model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    opt.step()
    after = dict(small.model.named_parameters())
    for n, p in big.model.named_parameters():  # AdamW's first step is ~lr * sign(g): compare against lr
        torch.testing.assert_close(after[n], p, rtol=0, atol=cfg.lr * 1e-2)


def test_micro_batches_respect_the_budget_and_cover_every_row() -> None:
    rollouts = batch(tiny_policy(), rows=20, seed=1)
    groups = micro_batches(rollouts, budget=50)
    assert sorted(i for g in groups for i in g) == list(range(20))
    size = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
    assert all(len(g) == 1 or max(size[i] for i in g) * len(g) <= 50 for g in groups)
    assert len(micro_batches(rollouts, budget=1)) == 20 and len(micro_batches(rollouts, budget=10**6)) == 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chosen_logprob_gradient(temperature: float) -> None:
    """The head's hand-written backward (logits recomputed, gradient in place) against autograd."""
    from pulse_node.rl.chunked import ChosenLogprob, chosen_logprobs

    g = torch.Generator().manual_seed(0)
    h, w, b = (torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((9, 5), (13, 5), (13,)))
    tokens = torch.randint(0, 13, (9,), generator=g)
    # a head weight that is not a leaf takes its gradient through autograd
    assert torch.autograd.gradcheck(lambda h, w, b: ChosenLogprob.apply(h, w * 1, b, tokens, temperature), (h, w, b))
    want = torch.log_softmax((h @ w.T + b) / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
    got = chosen_logprobs(h, (w, b), tokens, chunk=4, temperature=temperature)
    torch.testing.assert_close(got, want)
    # a leaf (a parameter) gets it added straight into .grad, chunk by chunk and backward by backward
    weights = torch.randn(9, generator=g, dtype=torch.float64)
    (want * weights).sum().backward()
    ref = [t.grad.clone() for t in (h, w, b)]
    for t in (h, w, b):
        t.grad = None
    for _ in range(2):
        (chosen_logprobs(h, (w, b), tokens, chunk=4, temperature=temperature) * weights).sum().backward()
    for t, r in zip((h, w, b), ref):
        torch.testing.assert_close(t.grad, 2 * r)


def test_ranks_run_as_many_micro_batches_and_padding_adds_nothing() -> None:
    """A sharded trainer's ranks run the same number of micro-batches (each forward is
    collective); the empty ones a rank pads with add nothing to its gradient."""
    from pulse_node.trainer.distributed import split_batch

    policy = tiny_policy()
    rollouts = batch(policy, rows=5, seed=2)
    adv = [1.0 if i % 2 else -1.0 for i in range(5)]
    shares = split_batch(rollouts, adv, 4, micro_batch_tokens=1)  # one row per micro-batch
    assert [len(s[0]) for s in shares] == [1, 1, 1, 2] and [s[3] for s in shares] == [2] * 4
    learner = GRPOLearner(policy, GRPOConfig(micro_batch_tokens=1))
    part, part_adv = shares[3][0], shares[3][1]
    one = learner.accumulate(part, part_adv)
    ref = grads(policy.model)
    policy.model.zero_grad(set_to_none=True)
    padded = learner.accumulate(part, part_adv, count=4)
    assert padded == one
    for n, g in grads(policy.model).items():
        torch.testing.assert_close(g, ref[n], rtol=0, atol=0)
