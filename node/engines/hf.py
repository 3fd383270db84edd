"""Batched sampling with Hugging Face transformers' `generate`, on CPU or GPU.

The default engine: works wherever torch does. Prompts are left-padded (as generation needs) and
each is repeated G times. One sampling path for every mode: our logits processor (`PickTokens`)
picks each row's next token with `node.sampling.race.pick_with_logprobs` (greedy at T = 0; at T > 0
the seeded race of checkable sampling, its keys from the completion's seed, or from torch's
generator when no seeds are given), masks every other token, and records the token's behaviour
log-prob of the raw logits row (the value of the learner's `logprobs_from_logits`, taken from the
race's own sums where no filter applies); `generate` then runs greedy over the one token left. So
no [rows, steps, V] logits are ever kept: completions of thousands of tokens cost one [rows] float
per step beyond the KV cache.

Completions stop on any of the model's EOS ids (`node.models.eos_token_ids`: the tokenizer's and
those of the model's generation config).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from node.sampling.race import KEY_WORDS, PositionKeys, pick_with_logprobs
from node.engines.base import Completion, PromptResult
from node.sampling.params import SamplingParams

log = logging.getLogger(__name__)

MAX_BATCH = 256
"""Most sequences (prompts x G) per `generate` call by default: bounds the KV cache (node/fit counts it)."""


class HFEngine:
    def __init__(self, model, tokenizer, model_id: str, version: int = 0, max_batch: int = MAX_BATCH,
                 eos_ids: list[int] | None = None) -> None:
        from node.models import eos_token_ids

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.version = version
        self.max_batch = max_batch
        """Most sequences (prompts x G) per `generate` call; bounds memory."""
        self.eos_ids = list(eos_ids) if eos_ids is not None else eos_token_ids(tokenizer, model_id)
        """A completion ends at the first of these (the tokenizer's EOS and the generation config's)."""

    def load_weights(self, state_dict: dict, version: int) -> None:
        self.model.load_state_dict(state_dict, strict=True)
        self.version = version

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[list[bytes]] | None = None) -> list[PromptResult]:
        per_call = max(1, self.max_batch // params.n)
        results: list[PromptResult] = []
        for start in range(0, len(prompts), per_call):
            chunk_seeds = seeds[start : start + per_call] if seeds is not None else None
            results.extend(self._generate_chunk(prompts[start : start + per_call], params, chunk_seeds))
        return results

    def _generate_chunk(self, prompts: list[str], params: SamplingParams,
                        seeds: list[list[bytes]] | None) -> list[PromptResult]:
        from transformers import GenerationConfig, LogitsProcessorList

        tok = self.tokenizer
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        prompt_len = enc["input_ids"].shape[1]
        row_seeds = [s for row in seeds for s in row] if seeds is not None and params.temperature > 0 else None
        picker = PickTokens(params, prompt_len, row_seeds)
        # our processor decides every token, so generate() runs greedy over G copies of each prompt
        gen_cfg = GenerationConfig(
            do_sample=False,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=1,
            pad_token_id=tok.pad_token_id,
            eos_token_id=self.eos_ids or None,
            output_logits=False,
            output_scores=False,
            return_dict_in_generate=True,
        )
        rows = {k: v.repeat_interleave(params.n, dim=0) for k, v in enc.items()}
        with _bare_generation_defaults(self.model):
            out = self.model.generate(**rows, generation_config=gen_cfg, logits_processor=LogitsProcessorList([picker]))
        new_tokens = out.sequences[:, prompt_len:]  # [B*G, steps]
        logps = picker.logprobs(new_tokens.shape)
        return self._to_results(prompts, enc, new_tokens.cpu(), logps.cpu(), params.n)

    def _to_results(self, prompts, enc, new_tokens, logps, n) -> list[PromptResult]:
        eos = set(self.eos_ids)
        results = []
        for i, prompt in enumerate(prompts):
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            res = PromptResult(prompt, prompt_ids)
            for row in range(i * n, (i + 1) * n):
                ids = new_tokens[row].tolist()
                stop = next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))
                ids = ids[:stop]
                res.completions.append(Completion(
                    token_ids=ids,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    logprobs=logps[row, :stop].tolist(),
                    finish_reason="stop" if ids and ids[-1] in eos else "length",
                ))
            results.append(res)
        return results


@contextlib.contextmanager
def _bare_generation_defaults(model):
    """The model's own generation defaults (a hub model's temperature, top-k, repetition penalty...)
    would fill every field our GenerationConfig leaves unset, and any logits processor they add
    would run before ours and change the logits it samples from and scores. SamplingParams say
    everything, so generate() sees transformers' neutral defaults instead, for the call."""
    from transformers import GenerationConfig

    saved = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


class PickTokens:
    """A transformers logits processor that picks each row's next token itself and masks the rest.

    Token t of row r is `pick_with_logprobs(raw logits, key)`: greedy at T = 0; otherwise the key is
    `position_keys(seeds[r], 1, t)` of checkable sampling (node/sampling/race.py) when seeds are
    given, or a draw of torch's generator (seeded by `torch.manual_seed`) when not. The chosen
    token's log softmax(raw logits / T) is recorded per step ([rows] float32, on the logits'
    device; no sync per token). Rows that finished keep being scored (generate pads them); their
    values past the stop are cut by the engine.
    """

    def __init__(self, params: SamplingParams, prompt_len: int, seeds: list[bytes] | None = None) -> None:
        self.params = params
        self.prompt_len = prompt_len
        self.seeds = seeds
        self.steps: list[torch.Tensor] = []
        self._keys: PositionKeys | None = None  # made on the first call, on the logits' device

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        p = self.params
        keys = None
        if p.temperature > 0:
            if self.seeds is not None:
                t = input_ids.shape[1] - self.prompt_len
                if self._keys is None:
                    self._keys = PositionKeys(self.seeds, p.max_new_tokens, scores.device)
                keys = self._keys.at(t)
            else:
                keys = torch.randint(0, 2**32, (scores.shape[0], KEY_WORDS), dtype=torch.int64, device=scores.device)
        chosen, logprobs = pick_with_logprobs(scores, keys, p.temperature, p.top_k, p.top_p)
        self.steps.append(logprobs)
        # in place: generate hands each step a copy of the logits (`to(copy=True)`), kept only
        # for `output_logits`, which the engine never asks; a new [rows, V] tensor cost ~10% of
        # the picker's time on a CPU (96 against 87 ms per token at 128 rows of 151,936)
        return scores.fill_(-torch.inf).scatter_(-1, chosen[:, None], 0.0)

    def logprobs(self, shape: tuple[int, int] | torch.Size) -> torch.Tensor:
        """The recorded log-probs, [rows, steps] float32 (steps = tokens generate() returned)."""
        rows, steps = shape
        if len(self.steps) != steps:  # one call per generated token; anything else is a transformers change
            raise RuntimeError(f"HF engine: {len(self.steps)} log-prob steps for {steps} generated tokens")
        if not steps:
            return torch.zeros(rows, 0)
        return torch.stack(self.steps, dim=1)
