"""Log-probs of the chosen tokens without a [tokens, vocabulary] tensor for the whole batch.

The learner needs one number per completion token: log softmax(h W^T / T)[token]. Computing
it as ``lm.logits`` does materialises FP32 logits for every position of every row (0.6 MB a
token at a 152k vocabulary) and keeps them, and their log-softmax, for backward. Here the model
runs to its last hidden states (``hidden_states``: the trunk, optionally with activation
checkpointing per block), only completion positions are kept, and the head + log-softmax +
gather runs over chunks of positions (``chosen_logprobs``), each chunk an autograd function
that keeps only its inputs and its log-sum-exp and recomputes its logits in backward (turning
them into their gradient in place): at any time at most one chunk's logits exist, once.

The numbers are those of ``rl/batch.token_logprobs`` (same head, same positions, same
temperature scaling, FP32 log-softmax) up to float rounding of the matmul order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pulse_node.rl.batch import Packed
from pulse_node.rl.models import HFLM, TinyLM, _full_allowed, positions

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Head = tuple[torch.Tensor, torch.Tensor | None]  # the output projection's weight and bias


def enable_hf_checkpointing(lm: TinyLM | HFLM) -> None:
    """Activation checkpointing of an HF model's decoder layers (non-reentrant); the tiny model
    checkpoints its blocks in ``hidden_states`` instead."""
    if not isinstance(lm, HFLM):
        return
    module, kw = lm.module, {"use_reentrant": False}
    if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def _tiny_hidden(lm: TinyLM, packed: Packed, *, recompute: bool) -> torch.Tensor:
    """``TinyGPT.forward`` up to (and including) the final LayerNorm, blocks optionally checkpointed."""
    m, mask = lm.module, packed.mask
    pos, allowed = positions(mask), _full_allowed(mask)
    x = m.tok_emb(packed.ids) + m.pos_emb(pos.clamp_max(m.max_len - 1))
    for i, block in enumerate(m.blocks):
        if recompute and torch.is_grad_enabled():
            x = checkpoint(block, x, allowed, None, i, use_reentrant=False)
        else:
            x = block(x, allowed, None, i)
    h: torch.Tensor = m.ln_f(x)
    return h


def _hf_head(module: PreTrainedModel) -> Head:
    head = module.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"chunked log-probs need a linear output head, not {type(head).__name__}")
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(module.config, attr, None) not in (None, 1.0):
            raise TypeError(f"chunked log-probs do not apply the model's {attr}")
    return head.weight, head.bias


def output_head(lm: TinyLM | HFLM) -> Head:
    """The weight and bias that project ``lm``'s last hidden states to its logits (TypeError for an
    HF head these functions cannot reproduce: not linear, soft-capped or scaled)."""
    return (lm.module.tok_emb.weight, None) if isinstance(lm, TinyLM) else _hf_head(lm.module)


def hidden_states(lm: TinyLM | HFLM, packed: Packed, *, recompute: bool = False) -> tuple[torch.Tensor, Head]:
    """[B, T, d] last hidden states (what the head projects) and the head's weight and bias.

    ``recompute``: checkpoint the tiny model's blocks (HF models use their own
    ``gradient_checkpointing_enable``, see ``enable_hf_checkpointing``).
    """
    head = output_head(lm)
    if isinstance(lm, TinyLM):
        return _tiny_hidden(lm, packed, recompute=recompute), head
    out = lm.module.base_model(input_ids=packed.ids, attention_mask=packed.mask.long(),
                               position_ids=positions(packed.mask), use_cache=False)
    return out.last_hidden_state, head


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    logits = F.linear(h, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # FP32 at least
    return logits.div_(temperature) if temperature != 1.0 else logits


class _Ctx(Protocol):
    """What ``ChosenLogprob`` keeps on torch's autograd context from forward to backward."""

    temperature: float
    param: torch.Tensor | None
    saved_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]
    needs_input_grad: tuple[bool, ...]

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None: ...


class ChosenLogprob(torch.autograd.Function):
    """log softmax(h W^T + b) / T at ``tokens``, its logits recomputed in backward and turned
    into their gradient in place: one [rows, vocabulary] FP32 tensor at a time (autograd's
    log_softmax + gather would keep the logits and the log-softmax, then make two more).

    A head weight that is a parameter gets its gradient added straight into ``.grad``
    (``addmm_``) instead of through autograd, which would make a [vocabulary, d] tensor per
    chunk and another per micro-batch before adding it: so the step's memory does not rise
    after the first micro-batch by a vocabulary-sized gradient. (Hooks on that parameter's
    gradient do not see this part.)"""

    @staticmethod
    def forward(ctx: _Ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tokens: torch.Tensor,
                temperature: float) -> torch.Tensor:
        logits = _logits(h, weight, bias, temperature)
        chosen = logits.gather(-1, tokens[:, None]).squeeze(-1)
        top = logits.amax(dim=-1, keepdim=True)
        lse = logits.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(-1))  # logsumexp, in place
        ctx.save_for_backward(h, weight, bias, tokens, lse)
        ctx.temperature = temperature
        ctx.param = weight if weight.is_leaf and weight.requires_grad else None
        return chosen - lse

    @staticmethod
    def backward(ctx: _Ctx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None, None]:
        h, weight, bias, tokens, lse = ctx.saved_tensors
        g = _logits(h, weight, bias, ctx.temperature).sub_(lse[:, None]).exp_()  # softmax
        g.mul_(-grad[:, None]).scatter_add_(-1, tokens[:, None], grad[:, None])  # (onehot - p) * grad
        if ctx.temperature != 1.0:
            g.div_(ctx.temperature)
        g = g.to(h.dtype)
        need = ctx.needs_input_grad
        grad_w = None
        if need[1] and ctx.param is not None:
            if ctx.param.grad is None:
                ctx.param.grad = g.T @ h
            else:
                ctx.param.grad.addmm_(g.T, h)
        elif need[1]:
            grad_w = g.T @ h
        return (g @ weight if need[0] else None, grad_w, g.sum(0) if bias is not None and need[2] else None,
                None, None)


def chosen_logprobs(h: torch.Tensor, head: Head, tokens: torch.Tensor, *, chunk: int,
                    temperature: float = 1.0) -> torch.Tensor:
    """[N] log-prob of ``tokens[i]`` given hidden state ``h[i]`` ([N, d]), ``chunk`` rows at a time."""
    weight, bias = head
    # torch.autograd.Function.apply is unannotated
    parts = [ChosenLogprob.apply(h[lo:lo + chunk], weight, bias, tokens[lo:lo + chunk], temperature)  # type: ignore[no-untyped-call]
             for lo in range(0, h.shape[0], chunk)]
    return torch.cat(parts) if parts else h[:, 0].float()  # no rows: still on the graph


def completion_logprobs(lm: TinyLM | HFLM, packed: Packed, *, chunk: int, recompute: bool = False,
                        temperature: float = 1.0) -> torch.Tensor:
    """[N] log-probs of the completion tokens of ``packed``, row by row (row-major over
    ``packed.target``), without the whole batch's logits."""
    hidden, head = hidden_states(lm, packed, recompute=recompute)
    h = hidden[:, :-1][packed.target]
    return chosen_logprobs(h, head, packed.ids[:, 1:][packed.target], chunk=chunk, temperature=temperature)
