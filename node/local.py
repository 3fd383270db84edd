"""The single-process, on-policy learning loop: one policy samples, scores and trains.

Each step draws `learner.groups_per_step` training problems, samples G completions per prompt with the
current weights (behaviour = learner, version = step), scores them with the task's reward,
and takes one optimizer step with the chosen loss. Because sampler and learner are the same
weights, every importance ratio starts at exactly 1: this is the "online" baseline that the
simulator's delayed runs are compared with.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from node.algorithms import get_algorithm
from node.config import ModelBlock, ProcessBlock, RunBlock
from node.device import resolve
from node.engines.hf import HFEngine
from node.learner.evaluate import eval_problems, evaluate
from node.learner import DROP
from node.metrics import Kind, Metric, MetricsWriter
from node.models import load_model, load_tokenizer
from node.tables import TablesBlock
from node.tasks import PromptStream, make_task
from node.training.batch import ScoredGroup, TrainPart, build_batch
from node.training.step import StepOptions, train_step

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class LocalConfig(TablesBlock, RunBlock, ProcessBlock, ModelBlock):
    """`hetero-node local`: the shared blocks (node/config.py, node/tables.py) and nothing of its own;
    the loss is `learner.own_loss` (every rollout is the learner's own, on-policy)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.learner.own_loss == DROP:
            raise ValueError("learner.own_loss: 'drop' would train on nothing; choose a loss")


def run_local(cfg: LocalConfig, on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """Train; returns the records written to metrics (step records and eval records)."""
    cfg.apply()  # seeds and threads (ProcessBlock)
    place = resolve(cfg.device, cfg.dtype)
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model, torch.float32, place.device)
    task = make_task(cfg.task, tok)
    options = StepOptions(cfg.learner.max_tokens_per_microbatch or None, place.autocast_dtype)
    lc = cfg.learner
    algo = get_algorithm(lc.own_loss)
    algo_cfg = algo.make_config(lc.own_options)
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
                part = TrainPart(lc.own_loss, batch, algo, algo_cfg)
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
