"""Honest bfloat16 samplers against the learner's float32 audit, and what a tolerance costs in detection.

    python examples/bench_bf16_audit.py [--groups 64] [--batches 1 8 32] [--lengths 256 1024]
    .venv-vllm/bin/python examples/bench_bf16_audit.py --models builtin --vllm     # vLLM's kernels

A volunteer's GPU samples in bfloat16 with its own kernels and batch sizes; the learner audits in
float32 (node/audit.py). For each sampler setting this prints, per audited token, how often its
seeded uniform u_t falls outside the token's interval of the auditor's CDF and by how much (the
miss distance, node/checkable.miss_distances), and per audited group (8 completions) the share
that a rule would fail: the false positives. Then, on the same groups, one completion edited at
one position (the smallest chosen completion: a token the sampler did not draw) and the share of
such groups each rule catches: the detection. Every share is printed with its 95% interval.

Models (no download):
  builtin  the built-in arithmetic model (trained; the demo's prompts, completions of <= 6 tokens)
  mid      a Qwen3-shaped model from a config (8 layers, hidden 512, vocabulary 32,768) with random
           weights, its output head scaled so that the next-token entropy is that of a trained LM
           (about 2-3 nats), prompts of random tokens, completions of --lengths tokens (no EOS)
The sampler is the HF engine's own sampling path (node/engines/hf.PickTokens) with the weights cast
to bfloat16; float32 at batch 8 is the baseline (what the audit was built for).
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import math
import random
import time

import torch

from node.audit import AuditItem, audit_distances
from node.checkable import group_seeds
from node.engines.base import SamplingParams
from node.engines.hf import PickTokens, _bare_generation_defaults
from node.logprobs import completion_logits, pack

RULES = (("tol", 1e-3), ("tol", 1e-2), ("rel", 0.1), ("rel", 0.25), ("rel", 0.5))
"""Each position passes if d <= tol (the audit so far: absolute, in CDF units), or if
d <= FLOOR + rel * m (relative to the boundary's room m, node/checkable.miss_distances)."""
FLOOR = 1e-5


def misses(d: torch.Tensor, m: torch.Tensor, rule: tuple[str, float]) -> torch.Tensor:
    kind, x = rule
    return d > x if kind == "tol" else d > FLOOR + x * m


def rule_name(rule: tuple[str, float]) -> str:
    return f"d <= {rule[1]:g}" if rule[0] == "tol" else f"d <= {FLOOR:g} + {rule[1]:g} m"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a share k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def share(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / max(n, 1):.2%} [{lo:.2%}, {hi:.2%}]"


def mid_model(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=64, vocab_size=32768, tie_word_embeddings=False,
                      max_position_embeddings=4096, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # random weights give a near-uniform next token; scale to a trained LM's entropy
        ids = torch.randint(1, cfg.vocab_size, (4, 64))
        for _ in range(20):
            logp = model(input_ids=ids).logits.log_softmax(-1)
            entropy = -(logp.exp() * logp).sum(-1).mean().item()
            if entropy < 3.0:
                break
            model.lm_head.weight.mul_(1.5)
    logging.getLogger(__name__).info("mid model: next-token entropy %.2f nats", entropy)
    return model


def sample(model, prompts: list[list[int]], params: SamplingParams, seeds: list[list[bytes]], batch: int,
           eos: list[int] | None, pad: int) -> list[list[tuple[list[int], list[float]]]]:
    """Completions of each prompt drawn by the HF engine's picker, `batch` rows per generate call."""
    from transformers import GenerationConfig

    rows = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
    out: list[list] = [[None] * params.n for _ in prompts]
    for s in range(0, len(rows), batch):
        chunk = rows[s : s + batch]
        width = max(len(prompts[i]) for i, _ in chunk)  # left-padded, as the engine does
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i, _ in chunk])
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i, _ in chunk])
        picker = PickTokens(params, width, [seeds[i][j] for i, j in chunk])
        cfg = GenerationConfig(do_sample=False, max_new_tokens=params.max_new_tokens, pad_token_id=pad,
                               eos_token_id=eos, return_dict_in_generate=True)
        with torch.no_grad(), _bare_generation_defaults(model):
            seq = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                                 logits_processor=[picker]).sequences[:, width:]
        logps = picker.logprobs(seq.shape)
        for r, (i, j) in enumerate(chunk):
            toks = seq[r].tolist()
            stop = next((k + 1 for k, t in enumerate(toks) if eos and t in eos), len(toks))
            out[i][j] = (toks[:stop], logps[r, :stop].tolist())
    return out


@torch.no_grad()
def one_edit(model, prompt: list[int], comp: tuple[list[int], list[float]], pad: int, rng: random.Random,
             how: str) -> tuple[list[int], list[float]]:
    """`comp` with the token at one random position replaced: by the most likely other token
    ('likely': a plausible edit) or by its neighbour in vocabulary order ('adjacent': the token
    whose interval lies next to the sampled one's, the hardest to tell by CDF distance)."""
    toks, lps = list(comp[0]), list(comp[1])
    t = rng.randrange(len(toks))
    if how == "likely":
        *_, (_, logits) = completion_logits(model, pack([prompt], [toks[: t + 1]], pad))  # position t is the last
        row = logits[-1].clone()
        row[toks[t]] = -torch.inf
        new = int(row.argmax())
    else:
        vocab = model.get_output_embeddings().out_features
        new = toks[t] + 1 if toks[t] + 1 < vocab else toks[t] - 1
    toks[t] = new
    return toks[: t + 1], lps[: t + 1]  # the completion ends at the edit (what follows would be re-drawn)


def hf_settings(model32, eos, pad, batches) -> list:
    """(dtype, label, sample(prompts, params, seeds)) for the HF engine's picker: float32 at batch 8
    (the baseline), then bfloat16 at each batch size."""
    def at(dtype: str, batch: int):
        def draw(prompts, params, seeds):
            sampler = model32 if dtype == "float32" else copy.deepcopy(model32).to(torch.bfloat16)
            return sample(sampler, prompts, params, seeds, batch, eos, pad)
        return dtype, f"HF {dtype} batch {batch}", draw
    return [at("float32", 8)] + [at("bfloat16", b) for b in batches]


def vllm_settings(model_id: str, tok, dtypes: list[str]) -> list:
    """The vLLM engine (its own kernels and batching) in each dtype, seeded as samplers run it."""
    from node.engines.vllm import VLLMConfig, VLLMEngine

    def at(dtype: str):
        def draw(prompts, params, seeds):
            engine = VLLMEngine(model_id, tok, VLLMConfig(dtype=dtype, max_model_len=256))
            res = engine.generate([tok.decode(p) for p in prompts], params, seeds=seeds)
            assert [r.prompt_token_ids for r in res] == prompts
            del engine
            gc.collect()
            return [[(c.token_ids, c.logprobs) for c in r.completions] for r in res]
        return dtype, f"vLLM {dtype}", draw
    return [at(d) for d in dtypes]


def run(name: str, model32, prompts, params, pad, settings, rng) -> None:
    log = logging.getLogger(__name__)
    nonce = bytes(16)
    seeds = [group_seeds(nonce, f"p{i}", "sampler", params.n) for i in range(len(prompts))]
    for dtype, label, draw in settings:
        t0 = time.perf_counter()
        groups = draw(prompts, params, seeds)
        t_sample = time.perf_counter() - t0
        items = [AuditItem(prompts[i], groups[i], seeds[i]) for i in range(len(prompts))]
        audited = [r for i in range(0, len(items), 4) for r in audit_distances(model32, items[i : i + 4], params, pad)]
        d_all = torch.cat([a[0] for a in audited])
        m_all = torch.cat([a[1] for a in audited])
        gaps = [a[2] for a in audited]
        out = d_all > 0
        ratio = d_all[out] / m_all[out].clamp(min=1e-300)
        q = lambda x, p: float(x.quantile(p)) if len(x) else 0.0  # noqa: E731
        print(f"\n{name}, sampler {label}: {len(items)} groups, {len(d_all)} tokens "
              f"(sampled in {t_sample:.0f} s), completion length mean {len(d_all) / (len(items) * params.n):.0f}")
        print(f"  tokens outside their interval: {share(int(out.sum()), len(d_all))}; miss distance d median "
              f"{q(d_all[out], 0.5):.2e}, max {float(d_all.max()):.2e}; d / m median {q(ratio, 0.5):.3f}, max "
              f"{float(ratio.max()) if len(ratio) else 0:.3f}; log-prob gap per token mean {sum(gaps) / len(gaps):.2e}, "
              f"max {max(gaps):.2e}")
        for rule in RULES:
            fp = sum(int(misses(a[0], a[1], rule).any()) for a in audited)
            print(f"  {rule_name(rule)}: honest groups failed (false positives) {share(fp, len(audited))}")
        if dtype == "float32":
            continue
        for how in ("likely", "adjacent"):
            chosen = []
            for it in items:
                j = rng.randrange(params.n)
                comps = list(it.completions)
                comps[j] = one_edit(model32, it.prompt_ids, comps[j], pad, rng, how)
                chosen.append(AuditItem(it.prompt_ids, comps, it.seeds))
            cd = [r for i in range(0, len(chosen), 4) for r in audit_distances(model32, chosen[i : i + 4], params, pad)]
            print(f"  one token edited ({how}), groups caught:")
            for rule in RULES:
                print(f"    {rule_name(rule)}: {share(sum(int(misses(a[0], a[1], rule).any()) for a in cd), len(cd))}")
        log.info("%s, %s done", name, label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["builtin", "mid"], choices=["builtin", "mid"])
    ap.add_argument("--groups", type=int, default=64, help="groups of 8 per setting")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="rows per generate call (bf16)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256], help="completion tokens (mid model)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--vllm", action="store_true", help="sample the built-in model with vLLM (its venv) instead of HF")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = random.Random(0)
    if "builtin" in args.models:
        from node.models import BUILTIN_MODEL, eos_token_ids, load_model, load_tokenizer
        from node.config import SamplingConfig
        from node.tasks import ArithmeticConfig, make_task

        tok, model = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL).eval()
        task = make_task(ArithmeticConfig())
        problems = list(task.split("train"))[: args.groups]
        prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        settings = (vllm_settings(BUILTIN_MODEL, tok, ["float32", "bfloat16"]) if args.vllm else
                    hf_settings(model, eos_token_ids(tok, BUILTIN_MODEL), tok.pad_token_id, args.batches))
        run("builtin (trained, T=1)", model, prompts, SamplingConfig().params, tok.pad_token_id, settings, rng)
    if "mid" in args.models:
        model = mid_model()
        for length in args.lengths:
            g = torch.Generator().manual_seed(length)
            prompts = torch.randint(1, 32768, (args.groups, args.prompt_len), generator=g).tolist()
            params = SamplingParams(n=8, temperature=1.0, max_new_tokens=length)
            run(f"mid (random weights, entropy ~2-3 nats), {length}-token completions", model, prompts, params,
                0, hf_settings(model, None, 0, args.batches), rng)


if __name__ == "__main__":
    main()
