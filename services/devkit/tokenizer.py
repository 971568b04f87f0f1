"""Byte-level BPE tokenizer for the tiny demo model, trained locally.

Training on :data:`~loraplane.devkit.corpus.CORPUS` is deterministic, so the
saved ``tokenizer.json`` (and its sha256, the ``tokenizer_revision``) is the
same on every machine for the pinned ``tokenizers`` / ``transformers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from loraplane.devkit.corpus import CORPUS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 800
"""Target vocabulary size (256 byte symbols + special tokens + merges)."""
BOS_TOKEN = "<|begin_of_text|>"
"""Beginning-of-sequence token (id 0)."""
EOS_TOKEN = "<|end_of_text|>"
"""End-of-sequence token (id 1); generation stops on it."""
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN)
"""Special tokens in id order."""
MODEL_MAX_LENGTH = 512
"""Longest sequence (matches the model's ``max_position_embeddings``)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
"""``role: content`` lines, like the chat part of the corpus."""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the tokenizer and wrap it for ``save_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS), trainer=trainer)
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (chat template inside)."""
    tokenizer.save_pretrained(str(out_dir), save_jinja_files=False)
