"""A model directory laid out as the Hugging Face hub cache holds it, for tests without a hub.

``put_in_hub_cache`` copies a model directory into ``<cache>/models--Org--Name/`` the way
``hf download`` writes it: every file once under ``blobs/<sha256>``, ``snapshots/<commit>/<file>``
as a relative symlink to its blob, and ``refs/main`` holding the commit; so ``model.path =
"Org/Name"`` resolves through ``huggingface_hub`` exactly as for a downloaded model.
``add_chat_template`` gives a local model's tokenizer a ChatML template (Qwen's format).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def add_chat_template(model_dir: str | Path, template: str = CHATML) -> None:
    """Save the tokenizer of ``model_dir`` again, with ``template`` as its chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    tok.chat_template = template
    tok.save_pretrained(model_dir)


def put_in_hub_cache(model_dir: str | Path, cache: str | Path, hub_id: str, *, commit: str,
                     ref: str | None = "main") -> Path:
    """Copy ``model_dir`` as snapshot ``commit`` of ``hub_id`` into the hub cache ``cache``;
    point ``refs/<ref>`` at it. Returns the snapshot directory."""
    repo = Path(cache) / ("models--" + hub_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(model_dir).iterdir()):
        if not f.is_file():
            continue
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snapshot / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.relpath(blob, snapshot), link)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
