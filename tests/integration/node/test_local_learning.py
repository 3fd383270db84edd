"""The local on-policy loop really learns: eval accuracy rises with GEPO and with GRPO."""

import pytest

from node.learner import LearnerConfig
from node.local import LocalConfig, run_local


@pytest.mark.parametrize("algorithm", ["gepo_lenclip", "gepo", "grpo"])
def test_eval_accuracy_rises(algorithm, tmp_path, capsys):
    cfg = LocalConfig(learner=LearnerConfig(own_loss=algorithm, eval_every=40, eval_size=300), steps=80,
                      metrics_path=str(tmp_path / "m.jsonl"))
    records = run_local(cfg)
    evals = [(r["version"], r["eval_acc"]) for r in records if r["kind"] == "eval"]
    with capsys.disabled():
        print(f"\n  {algorithm}: eval accuracy {evals}")
    assert evals[0][0] == 0 and evals[-1][0] == 80
    # measured here: +0.13 (gepo) and +0.16 (grpo). Another CPU rounds differently and so runs another
    # trajectory; at 300 problems one accuracy's standard error is ~0.029, so a bound of +0.04 keeps
    # ~3 standard errors below the smaller gain and still refuses a model that does not learn
    assert evals[-1][1] >= evals[0][1] + 0.04, evals
    steps = [r for r in records if r["kind"] == "step"]
    assert all(r["step_skipped"] == 0 for r in steps if "step_skipped" in r)
    assert (tmp_path / "m.jsonl").read_text().count("\n") == len(records)
