"""The single-process, on-policy learning loop: one policy samples, scores and trains.

Each step draws `learner.groups_per_step` training problems, samples G completions per prompt with the
current weights (behaviour = learner, version = step), scores them with the task's reward,
and takes one optimizer step with the chosen loss. Because sampler and learner are the same
weights, every importance ratio starts at exactly 1: this is the "online" baseline that the
simulator's delayed runs are compared with.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from node.algorithms import get_algorithm
from node.config import SamplingConfig, TaskConfig
from node.device import check_spec, resolve
from node.engines.hf import HFEngine
from node.learner.evaluate import eval_problems, evaluate
from node.learner import DROP, LearnerConfig
from node.metrics import Kind, Metric, MetricsWriter
from node.models import BUILTIN_MODEL, load_model, load_tokenizer
from node.tasks import ArithmeticConfig, PromptStream, make_task
from node.training.batch import ScoredGroup, TrainPart, build_batch
from node.training.step import StepOptions, train_step

log = logging.getLogger(__name__)


@dataclass
class LocalConfig:
    """`hetero-node local`: the same [task], [sampling] and [learner] tables as every command;
    the loss is `learner.stale_loss` (all rollouts are the learner's own, version 0 stale)."""

    model: str = BUILTIN_MODEL
    task: TaskConfig = field(default_factory=ArithmeticConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    steps: int = 400
    time_budget_s: float | None = None
    """Stop after this many seconds (a final evaluation still runs)."""
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto (node/device.py); the learner keeps float32 master weights."""
    dtype: str = "auto"
    """Compute dtype of the forward: auto (bfloat16 on a GPU, float32 on a CPU), float32 or bfloat16."""
    metrics_path: str | None = None
    """JSONL file with one line per step (and per evaluation)."""
    tensorboard_dir: str | None = None
    """Also write TensorBoard event files here."""

    def __post_init__(self) -> None:
        if self.learner.stale_loss == DROP:
            raise ValueError("learner.stale_loss: 'drop' would train on nothing; choose a loss")
        check_spec(self.device, self.dtype)
        if self.steps < 1 or self.threads < 1 or (self.time_budget_s is not None and self.time_budget_s <= 0):
            raise ValueError("need steps >= 1, threads >= 1 and time_budget_s > 0")


def run_local(cfg: LocalConfig, on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """Train; returns the records written to metrics (step records and eval records)."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    place = resolve(cfg.device, cfg.dtype)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model, torch.float32, place.device)
    task = make_task(cfg.task, tok)
    options = StepOptions(cfg.learner.max_tokens_per_microbatch or None, place.autocast_dtype)
    lc = cfg.learner
    algo = get_algorithm(lc.stale_loss)
    algo_cfg = algo.make_config(lc.stale_options)
    engine = HFEngine(model, tok, cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lc.lr, weight_decay=0.0)
    eval_set = eval_problems(task, lc.eval_size)
    stream = PromptStream(task.split("train"), cfg.seed)
    records: list[dict] = []
    sink = MetricsWriter(cfg.metrics_path, cfg.tensorboard_dir)

    def emit(rec: dict) -> None:
        records.append(rec)
        sink.write(rec)
        if on_record:
            on_record(rec)

    def run_eval(version: int) -> None:
        emit({Metric.KIND: Kind.EVAL, Metric.VERSION: version, Metric.TIME_S: round(time.time() - t0, 2),
              Metric.EVAL_ACC: evaluate(engine, task, eval_set, cfg.sampling.max_new_tokens)})

    t0 = time.time()
    run_eval(0)
    try:
        for version in range(1, cfg.steps + 1):
            problems = stream.take(lc.groups_per_step)
            results = engine.generate([p.prompt for p in problems], cfg.sampling.params)
            groups = [ScoredGroup(p.id, r.prompt_token_ids, r.completions,
                                  [task.reward(c.text, p.answer) for c in r.completions], cfg.model, version - 1)
                      for p, r in zip(problems, results)]
            rec = {Metric.KIND: Kind.STEP, Metric.VERSION: version, Metric.REWARD: _mean([x for g in groups for x in g.rewards])}
            batch = build_batch(groups, algo_cfg.normalize_std, tok.pad_token_id)
            if batch is not None:
                part = TrainPart(lc.stale_loss, batch, algo, algo_cfg)
                m = train_step(model, optimizer, [part], cfg.sampling.temperature, lc.max_grad_norm, options)
                m.pop("routes")
                rec.update(m)
            rec[Metric.GROUPS_SKIPPED_ZERO_VAR] = len(groups) - (batch.groups_used if batch is not None else 0)
            engine.version = version
            rec[Metric.TIME_S] = round(time.time() - t0, 2)
            emit(rec)
            out_of_time = cfg.time_budget_s is not None and time.time() - t0 > cfg.time_budget_s
            if (lc.eval_every and version % lc.eval_every == 0) or version == cfg.steps or out_of_time:
                run_eval(version)
            if out_of_time:
                break
    finally:
        sink.close()
    return records


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
