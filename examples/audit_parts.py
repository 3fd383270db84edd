"""The pieces the audit benchmarks share (examples/bench_bf16_audit.py, examples/bench_honest_groups.py):
random-weight Qwen3 shapes with a trained LM's next-token entropy, generation through the HF
engine's picker in batches, and the float32 auditor's margins and log-probs per group.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field

import torch

from node.audit.flips import FlipTest
from node.audit.margins import AuditItem, AuditResult, margins_at
from node.sampling.race import keys_tensor, position_keys
from node.sampling.params import SamplingParams
from node.engines.hf import PickTokens, _bare_generation_defaults
from node.learner.config import AuditConfig
from node.training.logprobs import completion_logits, logprobs_from_logits, pack

log = logging.getLogger("audit_parts")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def scale_head(model: torch.nn.Module, vocab: int, device, target: float = 3.0) -> float:
    """Scale a random model's output head until its next-token entropy is < `target` nats."""
    ids = torch.randint(1, vocab, (4, 64), device=device)
    entropy = float("inf")
    with torch.no_grad():
        for _ in range(30):
            logp = model(input_ids=ids).logits.float().log_softmax(-1)
            entropy = -(logp.exp() * logp).sum(-1).mean().item()
            if entropy < target:
                break
            model.lm_head.weight.mul_(1.5)
    return entropy


def random_model(kind: str, layers: int, device) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if kind == "mid":
        shape = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                     num_key_value_heads=4, head_dim=64, vocab_size=32768)
    else:  # Qwen3-0.6B's shape, untied so that scaling the head leaves the embeddings alone
        shape = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936)
    cfg = Qwen3Config(**shape, tie_word_embeddings=False, max_position_embeddings=4096, pad_token_id=0,
                      eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval().to(device)
    entropy = scale_head(model, cfg.vocab_size, device)
    log.info("%s model (%d layers, vocabulary %d): next-token entropy %.2f nats", kind, shape["num_hidden_layers"],
             cfg.vocab_size, entropy)
    return model


def generate(model, prompts: list[list[int]], params: SamplingParams, seeds: list[list[bytes]], batch: int,
             eos: list[int] | None, pad: int, picker=None, plain: bool = False) -> tuple[list, float]:
    """Completions of each prompt, `batch` rows per generate call, and the seconds it took: the HF
    engine's picker (or `picker(rows, width)`, or transformers' own multinomial when `plain`)."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    rows = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
    out: list[list] = [[None] * params.n for _ in prompts]
    elapsed = 0.0
    for s in range(0, len(rows), batch):
        chunk = rows[s : s + batch]
        width = max(len(prompts[i]) for i, _ in chunk)  # left-padded, as the engine does
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i, _ in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i, _ in chunk], device=device)
        proc = None if plain else (picker(chunk, width) if picker else PickTokens(params, width, [seeds[i][j] for i, j in chunk]))
        cfg = GenerationConfig(do_sample=plain, temperature=params.temperature if plain else None, top_k=None,
                               top_p=None, max_new_tokens=params.max_new_tokens, min_new_tokens=0 if eos else params.max_new_tokens,
                               pad_token_id=pad, eos_token_id=eos, return_dict_in_generate=True)
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad(), _bare_generation_defaults(model):
            seq = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                                 logits_processor=[proc] if proc else None).sequences[:, width:]
        _sync(device)
        elapsed += time.perf_counter() - t0
        logps = proc.logprobs(seq.shape).cpu() if proc else torch.zeros(seq.shape)
        seq = seq.cpu()
        for r, (i, j) in enumerate(chunk):
            toks = seq[r].tolist()
            stop = next((k + 1 for k, tk in enumerate(toks) if eos and tk in eos), len(toks))
            out[i][j] = (toks[:stop], logps[r, :stop].tolist())
    return out, elapsed


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@dataclass
class Measured:
    """Per group: every position's margin, and the learner's and the sampler's log-probs."""

    margins: list[torch.Tensor] = field(default_factory=list)
    mine: list[torch.Tensor] = field(default_factory=list)
    claimed: list[torch.Tensor] = field(default_factory=list)


@torch.no_grad()
def measure(model32, items: list[AuditItem], params: SamplingParams, pad: int, per_pass: int,
            slack: float = AuditConfig.margin, hard: float | None = AuditConfig.margin_hard) -> Measured:
    """The float32 auditor's margins and log-probs for every group (`per_pass` groups per forward),
    top-k / top-p applied with `slack` logits of slack, a token only an engine within `hard` keeps
    at margin `hard`, as the learner's audit does (node/audit/margins.margins_at)."""
    device = next(model32.parameters()).device
    out = Measured()
    for s in range(0, len(items), per_pass):
        part = items[s : s + per_pass]
        rows = [(it.prompt_ids, toks, lps, seed) for it in part for (toks, lps), seed in zip(it.completions, it.seeds)]
        batch = pack([r[0] for r in rows], [r[1] for r in rows], pad).to(device)
        tokens = torch.tensor([t for r in rows for t in r[1]], device=device)
        keys = keys_tensor([k for r in rows for k in position_keys(r[3], len(r[1]))], device)
        margins = torch.zeros(len(tokens), dtype=torch.float64, device=device)
        mine = torch.zeros(len(tokens), device=device)
        for sl, logits in completion_logits(model32, batch):
            margins[sl] = margins_at(logits, tokens[sl], keys[sl], params, slack, hard)
            mine[sl] = logprobs_from_logits(logits, tokens[sl], params.logprob_temperature)
        margins, mine = margins.cpu(), mine.cpu()
        claimed = torch.tensor([c for r in rows for c in r[2]])
        pos = 0
        for it in part:
            size = sum(len(toks) for toks, _ in it.completions)
            out.margins.append(margins[pos : pos + size])
            out.mine.append(mine[pos : pos + size])
            out.claimed.append(claimed[pos : pos + size])
            pos += size
    return out


def audits_to_refusal(results: list[AuditResult], flip_rate: float, exceed_rate: float, alarm: float,
                      rng: random.Random, orders: int = 200) -> float | None:
    """Mean audited groups until a sampler whose every audited group is one of `results` is refused
    (a group past the hard bound, or the flip or exceedance test, each at half the alarm, both fed
    every group as node/audit/auditor.py does), over `orders` random orders, each test from 0 (a
    proven sampler's record can add up to the tests' floor, 16.1 nats); None if some order is never refused."""
    total = 0
    for _ in range(orders):
        flips, exceed = FlipTest(flip_rate, alarm / 2), FlipTest(exceed_rate, alarm / 2)
        n = next((n for n, r in enumerate(rng.sample(results, len(results)), 1)
                  if (not r.passed) | flips.add("x", r.flips, r.positions) | exceed.add("x", r.exceedances, r.positions)),
                 None)
        if n is None:
            return None
        total += n
    return total / orders
