"""Loading causal LMs and tokenizers, and building the built-in tiny model's pieces.

Any Hugging Face causal LM loads from a local folder or a hub id (the hub path is for users;
tests and the demo use the model shipped in `node/assets/`). The built-in model is a tiny
Qwen3-architecture transformer with a character-level tokenizer built locally, warm-started by
`examples/make_tiny_model.py`.
"""

from __future__ import annotations

import logging
import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

ASSETS = Path(__file__).parent / "assets"
BUILTIN_MODEL = "builtin:tiny-arith"
"""Model id of the shipped tiny model; resolves to `node/assets/tiny-arith`."""
BUILTIN_MODEL_B = "builtin:tiny-arith-b"
"""A second, differently shaped tiny model (other size, other seed) for heterogeneous swarms."""

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
CHARS = string.digits + "+-*/=()., " + string.ascii_letters + "?!:;'\"\n\\{}[]^_%$#&<>|~`@"


def resolve_model_path(model_id: str) -> str:
    """Local folder for `builtin:NAME`; anything else is passed to transformers as is."""
    if model_id.startswith("builtin:"):
        path = ASSETS / model_id.split(":", 1)[1]
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{model_id}: no model at {path}; remake it with `python examples/make_tiny_model.py`"
            )
        return str(path)
    return model_id


def build_char_tokenizer() -> "PreTrainedTokenizerBase":
    """A character-level tokenizer: one token per character, unknown characters map to <unk>.

    Built with `tokenizers` (WordLevel over single characters) and wrapped as a regular
    `PreTrainedTokenizerFast`, so it saves and loads like any hub tokenizer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left", model_max_length=256,
    )


def tokenizer_hash(tok: "PreTrainedTokenizerBase") -> str:
    """Short hash of a tokenizer's vocabulary: equal hashes mean token ids are interchangeable."""
    import hashlib
    import json

    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.blake2b(json.dumps(vocab).encode(), digest_size=8).hexdigest()


def load_tokenizer(model_id: str) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path(model_id))
    if tok.pad_token is None:  # many causal LMs ship without one; generation needs it
        tok.pad_token = tok.eos_token
    return tok


def load_model(model_id: str, dtype: "torch.dtype | None" = None, device: str = "cpu") -> "PreTrainedModel":
    """A causal LM in eval mode on `device` (float32 on CPU unless `dtype` says otherwise)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load clutters logs of long-running nodes

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(model_id), dtype=dtype or torch.float32
    )
    log.info("loaded %s: %.2fM parameters", model_id, sum(p.numel() for p in model.parameters()) / 1e6)
    return model.to(device).eval()
