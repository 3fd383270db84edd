"""Qwen3-shaped models with random weights, built from a config on the spot (never downloaded).

    model = build("qwen3-0.6b")            # torch model, float32, random weights
    groups = synthetic_groups(tok_or_vocab, n_groups, group_size, prompt_len, completion_len)

The shapes are those of the published Qwen3 configs (hidden size, layers, heads, vocabulary of
151,936 tokens); speed and memory depend on shapes, not on what the weights learned.
"""

from __future__ import annotations

import torch

from node.fit.shape import QWEN3, ModelShape

_FIGURES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "tie_word_embeddings")
SHAPES: dict[str, dict] = {
    # the published figures, kept once (node/fit/shape.py)
    "qwen3-0.6b": {k: QWEN3["Qwen/Qwen3-0.6B"][k] for k in _FIGURES},
    "qwen3-1.7b": {k: QWEN3["Qwen/Qwen3-1.7B"][k] for k in _FIGURES},
    # a tiny body under a Qwen3-sized vocabulary: the output head dominates memory (tests)
    "wide-vocab-tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=32, vocab_size=151936, tie_word_embeddings=False),
}


def shape_of(shape: str, layers: int | None = None) -> dict:
    """The config figures of `shape`, with `layers` transformer layers instead of its own (a
    shorter model of the same widths and vocabulary: the output head and the embedding, which a
    151k vocabulary makes the largest tensors, are unchanged)."""
    s = dict(SHAPES[shape])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, not {layers}")
        s["num_hidden_layers"] = layers
    return s


def build(shape: str, max_positions: int = 40960, seed: int = 0, layers: int | None = None) -> torch.nn.Module:
    """A Qwen3ForCausalLM of `shape` (with `layers` layers, see `shape_of`) in float32 with random
    weights, in eval mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**shape_of(shape, layers), max_position_embeddings=max_positions, rope_theta=1_000_000.0,
                      pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).eval()


def parameters(shape: str, layers: int | None = None) -> int:
    """Parameter count of a shape (tied embeddings counted once), without building it."""
    return ModelShape.from_config(dict(shape_of(shape, layers), model_type="qwen3"), shape).parameters


def synthetic_groups(vocab: int, n_groups: int, group_size: int, prompt_len: int, completion_len: int, seed: int = 0):
    """Scored groups of random tokens (rewards alternate, behaviour log-probs near -log V): the
    shapes of a real step, for timing and memory."""
    from node.engines.base import Completion
    from node.training.batch import ScoredGroup

    g = torch.Generator().manual_seed(seed)
    groups = []
    for k in range(n_groups):
        prompt = torch.randint(2, vocab, (prompt_len,), generator=g).tolist()
        comps = []
        for j in range(group_size):
            toks = torch.randint(2, vocab, (completion_len,), generator=g).tolist()
            lps = (-torch.rand(completion_len, generator=g) - 11.5).tolist()  # ~ log(1 / 151936)
            comps.append(Completion(toks, "", lps, "length"))
        groups.append(ScoredGroup(f"p{k}", prompt, comps, [float(j % 2) for j in range(group_size)], "bench", 0))
    return groups


def tokenizer(vocab: int):
    """A word-level tokenizer of exactly `vocab` tokens: the built-in model's characters, then
    filler tokens; prompts of plain text tokenize to characters, as with the built-in model."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from node.models import CHARS, SPECIAL_TOKENS

    names = [*SPECIAL_TOKENS, *CHARS]
    names += [f"<t{i}>" for i in range(vocab - len(names))]
    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(names)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left", model_max_length=40960)


def save(shape: str, folder: str, dtype: torch.dtype = torch.bfloat16, layers: int | None = None,
         max_positions: int = 40960) -> str:
    """Write a shaped model (random weights, `dtype`) and its tokenizer as a model folder that
    every engine loads like a downloaded one (e.g. `examples/bench_vllm.py --model FOLDER`)."""
    model = build(shape, max_positions, layers=layers).to(dtype)
    model.config.dtype = dtype
    model.save_pretrained(folder)
    tokenizer(model.config.vocab_size).save_pretrained(folder)
    return folder
