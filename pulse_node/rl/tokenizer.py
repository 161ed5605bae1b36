"""Tokenizers behind one small interface: the embedded character tokenizer and an HF adapter.

``encode`` returns the ids a prompt is fed as (with BOS if the tokenizer uses one), and is the
one place a prompt's text becomes the text the model sees: with a chat template on
(``task.chat_template``), ``HFTokenizer.render`` wraps the prompt as a user message (after an
optional system prompt) through ``apply_chat_template(..., add_generation_prompt=True)``, so
assigned prompts, the sampler, the trainers' verification and evaluation all feed the same
rendered text. ``decode`` drops special tokens. Unknown characters raise ``ValueError``;
callers turn that into a ``DataError`` naming the problem's file and line.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_target(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """Character-level: <pad>, <bos>, <eos>, then printable ASCII and newline (98 tokens)."""

    SPECIALS = ("<pad>", "<bos>", "<eos>")

    def __init__(self) -> None:
        chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
        self.itos = list(self.SPECIALS) + chars
        self.stoi = {c: i for i, c in enumerate(self.itos) if i >= len(self.SPECIALS)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.vocab_size = len(self.itos)

    def _chars(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tiny model's vocabulary") from None

    def encode(self, text: str) -> list[int]:
        return [self.bos_id] + self._chars(text)

    def encode_target(self, text: str) -> list[int]:
        """Ids of a completion the model should produce (ends with EOS)."""
        return self._chars(text) + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids if i >= len(self.SPECIALS) and i < self.vocab_size)


class HFTokenizer:
    """Adapter over a ``transformers`` tokenizer loaded from a local directory."""

    def __init__(self, tok: PreTrainedTokenizerBase, *, chat: bool = False, system_prompt: str | None = None) -> None:
        if tok.eos_token_id is None:
            raise ValueError("the tokenizer defines no eos_token")
        if chat and not getattr(tok, "chat_template", None):
            raise ValueError("a chat template is asked for, but the tokenizer has none")
        self.tok = tok
        self.chat, self.system_prompt = chat, system_prompt
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.vocab_size = len(tok)

    def render(self, text: str) -> str:
        """The text the model is fed for prompt ``text`` (the chat template's, when on)."""
        if not self.chat:
            return text
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        return _text(self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def encode(self, text: str) -> list[int]:
        # a rendered template holds its own special tokens (BOS included where the model has one)
        ids = list(self.tok(self.render(text), add_special_tokens=not self.chat)["input_ids"])
        if self.tok.unk_token_id is not None and self.tok.unk_token_id in ids:
            raise ValueError("text contains tokens unknown to the tokenizer")
        return ids

    def encode_target(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        return _text(self.tok.decode(ids, skip_special_tokens=True))


def _text(out: object) -> str:
    """``out`` as text (transformers types rendering and decoding as text-or-lists; one
    conversation or one id sequence gives text)."""
    if not isinstance(out, str):
        raise TypeError(f"the tokenizer returned {type(out).__name__}, not text")
    return out
