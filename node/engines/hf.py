"""Batched sampling with Hugging Face transformers' `generate`, on CPU or GPU.

The default engine: works wherever torch does. Prompts are left-padded (as generation needs) and
each is repeated G times; behaviour log-probs come from `generate`'s raw logits through the same
`logprobs_from_logits` the learner uses.
"""

from __future__ import annotations

import logging

import torch

from ..checkable import pick_tokens, uniforms
from ..logprobs import logprobs_from_logits
from .base import Completion, PromptResult, SamplingParams

log = logging.getLogger(__name__)


class HFEngine:
    def __init__(self, model, tokenizer, model_id: str, version: int = 0, max_batch: int = 256) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.version = version
        self.max_batch = max_batch
        """Most sequences (prompts x G) per `generate` call; bounds memory."""

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
        greedy = params.temperature == 0
        checkable = seeds is not None and not greedy
        processors = LogitsProcessorList()
        if checkable:
            # our processor picks each token from the seeded uniforms and masks the rest, so
            # generate() runs greedy over one copy of each prompt per completion: no randomness of its own
            processors.append(CheckableSampling([s for row in seeds for s in row], enc["input_ids"].shape[1], params))
        sampled = not greedy and not checkable
        copies = 1 if sampled else params.n  # generate() wants num_return_sequences=1 unless it samples
        gen_cfg = GenerationConfig(
            do_sample=sampled,
            temperature=params.temperature if sampled else None,
            top_p=params.top_p if sampled else None,
            top_k=params.top_k if sampled else None,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n // copies,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        rows = {k: v.repeat_interleave(copies, dim=0) for k, v in enc.items()} if copies > 1 else enc
        out = self.model.generate(**rows, generation_config=gen_cfg, logits_processor=processors)
        prompt_len = enc["input_ids"].shape[1]
        new_tokens = out.sequences[:, prompt_len:]  # [B*G, steps]
        logits = torch.stack(out.logits, dim=1)  # [B*G, steps, V], raw (before processors)
        logps = logprobs_from_logits(logits, new_tokens, params.logprob_temperature).cpu()
        return self._to_results(prompts, enc, new_tokens.cpu(), logps, params.n)

    def _to_results(self, prompts, enc, new_tokens, logps, n) -> list[PromptResult]:
        eos = self.tokenizer.eos_token_id
        results = []
        for i, prompt in enumerate(prompts):
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            res = PromptResult(prompt, prompt_ids)
            for row in range(i * n, (i + 1) * n):
                ids = new_tokens[row].tolist()
                stop = ids.index(eos) + 1 if eos in ids else len(ids)
                ids = ids[:stop]
                res.completions.append(Completion(
                    token_ids=ids,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    logprobs=logps[row, :stop].tolist(),
                    finish_reason="stop" if ids and ids[-1] == eos else "length",
                ))
            results.append(res)
        return results


class CheckableSampling:
    """A transformers logits processor that draws token t of row r as node.checkable prescribes
    (the seeded uniform u_t through the tempered, filtered CDF) and masks every other token."""

    def __init__(self, seeds: list[bytes], prompt_len: int, params: SamplingParams) -> None:
        self.seeds = seeds
        self.prompt_len = prompt_len
        self.params = params

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_len
        us = torch.tensor([uniforms(seed, 1, t)[0] for seed in self.seeds], dtype=torch.float64)
        p = self.params
        chosen = pick_tokens(scores, us, p.temperature, p.top_k, p.top_p)
        forced = torch.full_like(scores, -torch.inf)
        return forced.scatter(-1, chosen[:, None].to(scores.device), 0.0)
