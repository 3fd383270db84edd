"""Sampler throughput: the node's overhead over vLLM, and vLLM against the HF engine.

    .venv-vllm/bin/python examples/bench_vllm.py [--prompts 64] [--group 8] [--batches 5]

Run it in an environment with vLLM (README, "vLLM"). Same model (the built-in one unless
`--model`), same prompts (the arithmetic task's train split), same batch and sampling settings:
  vllm direct   `LLM.generate` on pre-tokenised prompts, nothing else (the baseline);
  node + vllm   `Sampler.produce` with the vLLM engine (tokenise, generate, read log-probs,
                score with the task's reward, build the records) plus encoding every record
                for the wire: what a sampler does per batch;
  node + hf     the same with the HF transformers engine.
Prints completions per second and ratios. A warm-up batch precedes each measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn, batches: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per batch")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    import torch
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    from node.sampling.params import SamplingConfig
    from node.engines.hf import HFEngine
    from node.engines.vllm import VLLMConfig, VLLMEngine
    from node.models import load_model, load_tokenizer, tokenizer_hash
    from node.sampling.sampler import Sampler
    from node.tasks import ArithmeticConfig, make_task

    tok = load_tokenizer(args.model)
    task = make_task(ArithmeticConfig())
    sampling = SamplingConfig(group_size=args.group, max_new_tokens=args.max_new_tokens)
    vllm_engine = VLLMEngine(args.model, tok, VLLMConfig(dtype=args.dtype, max_model_len=256))
    hf_engine = HFEngine(load_model(args.model), tok, args.model)
    node_vllm = Sampler("bench-vllm", task, vllm_engine, tokenizer_hash(tok), sampling=sampling,
                        prompts_per_batch=args.prompts)
    node_hf = Sampler("bench-hf", task, hf_engine, tokenizer_hash(tok), sampling=sampling,
                      prompts_per_batch=args.prompts)

    prompts = [p.prompt for p in node_vllm.stream.take(args.prompts)]
    ids = [TokensPrompt(prompt_token_ids=tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    direct_params = VSamplingParams(n=args.group, temperature=1.0, max_tokens=args.max_new_tokens, logprobs=0,
                                    detokenize=False, stop_token_ids=[tok.eos_token_id])

    def direct():
        vllm_engine.llm.generate(ids, direct_params, use_tqdm=False)

    def through(node):
        return lambda: [g.encode() for g in node.produce()]

    per_batch = args.prompts * args.group
    rows = [("vllm direct", timed(direct, args.batches)),
            ("node + vllm", timed(through(node_vllm), args.batches)),
            ("node + hf", timed(through(node_hf), args.batches))]
    base = statistics.median(rows[0][1])
    print(f"\nmodel {args.model}, {args.prompts} prompts x G={args.group}, max {args.max_new_tokens} new tokens, "
          f"{args.dtype}, torch threads {torch.get_num_threads()}, median of {args.batches} batches")
    print(f"{'path':<14}{'s/batch':>9}{'completions/s':>15}{'vs vllm direct':>16}")
    for name, secs in rows:
        med = statistics.median(secs)
        print(f"{name:<14}{med:9.3f}{per_batch / med:15.0f}{base / med:15.2f}x")
    vllm_node, hf_node = statistics.median(rows[1][1]), statistics.median(rows[2][1])
    print(f"\nnode overhead over vllm direct: {(vllm_node - base) / base:+.0%}; "
          f"vllm engine vs hf engine through the node: {hf_node / vllm_node:.2f}x the throughput")


if __name__ == "__main__":
    main()
