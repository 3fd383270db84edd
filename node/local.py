"""The single-process, on-policy learning loop: one policy samples, scores and trains.

Each step draws `prompts_per_step` training problems, samples G completions per prompt with the
current weights (behaviour = learner, version = step), scores them with the task's reward,
and takes one optimizer step with the chosen loss. Because sampler and learner are the same
weights, every importance ratio starts at exactly 1: this is the "online" baseline that the
simulator's delayed runs are compared with.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .algorithms import get_algorithm
from .engines.base import SamplingParams
from .engines.hf import HFEngine
from .evaluate import evaluate
from .models import BUILTIN_MODEL, load_model, load_tokenizer
from .tasks import ArithmeticConfig, DatasetTaskConfig, make_task, PromptStream
from .trainer import ScoredGroup, TrainPart, build_batch, train_step

log = logging.getLogger(__name__)


@dataclass
class LocalConfig:
    model: str = BUILTIN_MODEL
    task: ArithmeticConfig | DatasetTaskConfig = field(default_factory=ArithmeticConfig)
    algorithm: str = "gepo"
    algorithm_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 400
    prompts_per_step: int = 16
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 6
    lr: float = 3e-5
    """Adam at 1e-4 and above destabilises the tiny model (measured: greedy accuracy collapses)."""
    max_grad_norm: float = 1.0
    eval_every: int = 50
    eval_size: int = 300
    time_budget_s: float | None = None
    """Stop after this many seconds (a final evaluation still runs)."""
    seed: int = 0
    threads: int = 2
    metrics_path: str | None = None
    """JSONL file with one line per step (and per evaluation)."""

    def __post_init__(self) -> None:
        get_algorithm(self.algorithm).make_config(self.algorithm_options)  # fail early, with the fix
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: advantages are relative to the group")


def run_local(cfg: LocalConfig, on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """Train; returns the records written to metrics (step records and eval records)."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model)
    task = make_task(cfg.task)
    algo = get_algorithm(cfg.algorithm)
    algo_cfg = algo.make_config(cfg.algorithm_options)
    engine = HFEngine(model, tok, cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    eval_set = random.Random(1234).sample(list(task.split("eval")), min(cfg.eval_size, len(task.split("eval"))))
    stream = PromptStream(task.split("train"), cfg.seed)
    params = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p,
                            max_new_tokens=cfg.max_new_tokens)
    records: list[dict] = []
    if cfg.metrics_path:
        Path(cfg.metrics_path).parent.mkdir(parents=True, exist_ok=True)
    sink = open(cfg.metrics_path, "a") if cfg.metrics_path else None

    def emit(rec: dict) -> None:
        records.append(rec)
        if sink:
            sink.write(json.dumps(rec) + "\n")
            sink.flush()
        if on_record:
            on_record(rec)

    t0 = time.time()
    emit({"kind": "eval", "step": 0, "time_s": 0.0, "eval_acc": evaluate(engine, task, eval_set, cfg.max_new_tokens)})
    step = 0
    for step in range(1, cfg.steps + 1):
        problems = stream.take(cfg.prompts_per_step)
        results = engine.generate([p.prompt for p in problems], params)
        groups = [ScoredGroup(p.id, r.prompt_token_ids, r.completions,
                              [task.reward(c.text, p.answer) for c in r.completions], cfg.model, step - 1)
                  for p, r in zip(problems, results)]
        rec = {"kind": "step", "step": step, "reward": _mean([x for g in groups for x in g.rewards])}
        batch = build_batch(groups, algo_cfg.normalize_std, tok.pad_token_id)
        if batch is not None:
            m = train_step(model, optimizer, [TrainPart(cfg.algorithm, batch, algo, algo_cfg)], cfg.temperature, cfg.max_grad_norm)
            m.pop("routes")
            rec.update(m)
            rec.update(groups_used=batch.groups_used, groups_skipped=batch.groups_skipped)
        else:
            rec.update(groups_used=0, groups_skipped=len(groups))
        engine.version = step
        rec["time_s"] = round(time.time() - t0, 2)
        emit(rec)
        out_of_time = cfg.time_budget_s is not None and time.time() - t0 > cfg.time_budget_s
        if step % cfg.eval_every == 0 or step == cfg.steps or out_of_time:
            emit({"kind": "eval", "step": step, "time_s": round(time.time() - t0, 2),
                  "eval_acc": evaluate(engine, task, eval_set, cfg.max_new_tokens)})
        if out_of_time:
            break
    if sink:
        sink.close()
    return records


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
