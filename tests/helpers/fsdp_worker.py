"""One rank of tests/integration/node/test_distributed_ranks.py:
`torchrun --nproc-per-node 2 tests/helpers/fsdp_worker.py MODE OUT [RESUME]`.

MODE "spmd": every rank calls train_step on the sharded model for STEPS steps; rank 0 saves the
gathered weights, optimizer state and metrics to OUT (torch.save).
MODE "leader": rank 0 drives a Leader while rank 1 follows: 2 steps, a state gather, step 3, a load
of the gathered state and step 3 again, then (with RESUME, a one-process checkpoint after step 2)
a load of that and step 3 once more; rank 0 saves what it saw.

`make_parts` and `reference` are also what the test runs in one process to compare with.
FSDP_WORKER_DTYPE=float32 in the environment trains in float32 instead (see DTYPE).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # torchrun runs this file as a script: the repo root

from node.algorithms import get_algorithm  # noqa: E402
from node.engines.base import Completion  # noqa: E402
from node.training.logprobs import completion_logprobs, completion_span, pack  # noqa: E402
from node.models import BUILTIN_MODEL, load_model, load_tokenizer  # noqa: E402
from node.training.batch import ScoredGroup, TrainPart, build_batch
from node.training.step import StepOptions, train_step  # noqa: E402

STEPS = 3
TEMPERATURE = 0.7
LR = 1e-3
BUDGET = 16
"""Padded tokens per micro-batch: one or two rows (the longest alone); 11 micro-batches per step,
dealt over the ranks (one rank runs an idle pass), groups split across micro-batches and ranks."""
DTYPE = getattr(torch, os.environ.get("FSDP_WORKER_DTYPE", "float64"))
"""Float64 makes the comparison with one process sharp: AdamW turns a gradient's rounding error δ
into a weight error up to lr * δ / eps (1e5 δ) where the gradient is near zero, so in float32 a
different summation order (two ranks) moves a few weights by ~1e-4. In float64 (weights and, since
node/training/logprobs.py keeps a float64 model's log-probs in float64, the loss) δ <~ 1e-12 bounds that by
~1e-7 per step; measured: ~4e-15 after 3 steps."""


def make_parts(tok, base: torch.nn.Module, step: int) -> list[TrainPart]:
    """Step `step`'s GEPO part: 4 groups of 4 or 5 completions of different lengths; behaviour log-probs
    are the `base` model's plus noise (stale, as GEPO corrects them), one sequence claims far too
    low ones and fails the log-prob gap (dropped on every rank alike)."""
    g = torch.Generator().manual_seed(100 + step)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    shapes = []  # (prompt, [completion tokens]) per group; 17 rows in all: an odd number of micro-batches
    for k in range(4):
        size = 5 if k == step else 4
        shapes.append((ids(f"{k + step + 3}*{k + 7}="),
                       [ids(str(1000 * (k + step + 1) + 37 * j)[: 1 + (j + k + step) % 4]) + [1] for j in range(size)]))
    rows = [(p, c) for p, cs in shapes for c in cs]
    with torch.no_grad():  # one forward for every row
        lp = completion_logprobs(base, pack([p for p, _ in rows], [c for _, c in rows], tok.pad_token_id), TEMPERATURE)
    behaviour = iter(lp[i, completion_span(len(p), len(c))] + 0.3 * torch.randn(len(c), generator=g, dtype=lp.dtype)
                     for i, (p, c) in enumerate(rows))
    groups = [ScoredGroup(f"p{step}.{k}", p, [Completion(c, "", next(behaviour).tolist(), "stop") for c in cs],
                          [float((j + k + step) % 2) for j in range(len(cs))], "m", 0)
              for k, (p, cs) in enumerate(shapes)]
    groups[1].completions[2].logprobs = [-18.0] * len(groups[1].completions[2].token_ids)
    algo = get_algorithm("gepo")
    cfg = algo.make_config({"beta": 0.05})
    return [TrainPart("stale", build_batch(groups, cfg.normalize_std, tok.pad_token_id), algo, cfg, 8.0)]


def new_optimizer(module: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=0.0)  # as the learner's


def reference(steps: int = STEPS, dtype: torch.dtype = DTYPE) -> list[tuple[dict[str, torch.Tensor], dict, dict]]:
    """[(weights, optimizer state, metrics) after each of `steps` plain steps in one process (no
    FSDP, the whole batch at once)]."""
    from node.training.distributed import optimizer_state

    tok, lm, base = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL, dtype), load_model(BUILTIN_MODEL, dtype)
    opt = new_optimizer(lm)
    out = []
    for s in range(steps):
        metrics = train_step(lm, opt, make_parts(tok, base, s), TEMPERATURE)
        out.append(({k: v.clone() for k, v in lm.state_dict().items()}, optimizer_state(lm, opt), metrics))
    return out


def main(mode: str, out: str, resume: str | None = None) -> None:
    from node.training.distributed import Leader, follow, full_state_dict, init_from_env, optimizer_state, shard

    Path(f"{out}.rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))  # the test kills leftovers by PID
    torch.manual_seed(0)
    coll = init_from_env("cpu", timeout=timedelta(seconds=120), idle_timeout=timedelta(seconds=120))
    assert coll is not None and coll.world == 2, "run under torchrun --nproc-per-node 2"
    module = shard(load_model(BUILTIN_MODEL, DTYPE))
    opt = new_optimizer(module)
    try:
        if mode == "leader" and coll.rank > 0:
            assert follow(module, opt, coll) == (5 if resume else 4)  # the parts come from rank 0
            return
        tok, base = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL, DTYPE)
        step_args = [(make_parts(tok, base, s), TEMPERATURE, 1.0, StepOptions(max_tokens_per_microbatch=BUDGET))
                     for s in range(STEPS)]
        if mode == "spmd":
            metrics = [train_step(module, opt, *args, dist=coll) for args in step_args]
            weights, optim = full_state_dict(module), optimizer_state(module, opt)
            if coll.rank == 0:
                torch.save({"weights": weights, "optim": optim, "metrics": metrics}, out)
            else:
                assert weights == {} and optim == {}
        elif mode == "leader":
            lead = Leader(module, opt, coll)
            got = {"metrics": [lead.step(*step_args[0]), lead.step(*step_args[1])]}
            got["weights2"], got["optim2"] = w2, o2 = lead.state_dict(), lead.optimizer_state()
            lead.keepalive(0)
            got["metrics"].append(lead.step(*step_args[2]))
            got["weights3"] = lead.state_dict()
            lead.load(w2, o2)  # resume from the state gathered after step 2, and take step 3 again
            lead.step(*step_args[2])
            got["weights3_again"] = lead.state_dict()
            if resume:  # a checkpoint of one process after step 2: step 3 on 2 ranks from there
                ref = torch.load(resume, weights_only=False)
                lead.load(ref["weights"], ref["optim"])
                lead.step(*step_args[2])
                got["weights3_resumed"] = lead.state_dict()
            torch.save(got, out)
            lead.stop()
        else:
            raise ValueError(mode)
    finally:
        coll.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
