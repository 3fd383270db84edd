"""Typed config from TOML + flags, and the CLI (instant --help, real local run)."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cli.main import app
from node.config import load_config
from node.local import LocalConfig
from node.tasks import ArithmeticConfig, DatasetTaskConfig


def test_toml_then_flags_with_nested_task(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('algorithm = "grpo"\nsteps = 7\n[algorithm_options]\neps_high = 0.28\n'
                 '[task]\nkind = "arithmetic"\ndigits = 1\nops = ["+"]\n')
    cfg = load_config(LocalConfig, f, {"steps": 3, "lr": None})
    assert cfg.algorithm == "grpo" and cfg.steps == 3 and cfg.algorithm_options == {"eps_high": 0.28}
    assert cfg.task == ArithmeticConfig(digits=1, ops=("+",))
    f.write_text('[task]\nkind = "dataset"\ntrain_files = ["a.jsonl"]\n')
    assert isinstance(load_config(LocalConfig, f).task, DatasetTaskConfig)


def test_config_errors_say_how_to_fix():
    with pytest.raises(ValueError, match="valid keys"):
        load_config(LocalConfig, None, {"stepz": 3})
    with pytest.raises(ValueError, match="choose one of"):
        LocalConfig(algorithm="ppo")
    with pytest.raises(ValueError, match="valid:"):
        LocalConfig(algorithm="gepo", algorithm_options={"clip": 0.1})
    with pytest.raises(ValueError, match="group_size"):
        LocalConfig(group_size=1)


def test_help_is_instant_because_heavy_imports_are_deferred():
    code = "import sys, cli.main; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    out = subprocess.run([sys.executable, "-m", "cli.main", "--help"], capture_output=True, text=True, check=True)
    assert "demo" in out.stdout and "local" in out.stdout


def test_local_command_runs_a_short_real_training(tmp_path):
    metrics = tmp_path / "runs" / "m.jsonl"  # a folder that does not exist yet, as in examples/local.toml
    cfg = tmp_path / "c.toml"
    cfg.write_text("prompts_per_step = 4\ngroup_size = 4\neval_size = 20\neval_every = 2\n")
    res = CliRunner().invoke(app, ["local", "--config", str(cfg), "--steps", "3", "--metrics", str(metrics)])
    assert res.exit_code == 0, res.output
    assert "eval accuracy" in res.output
    lines = metrics.read_text().splitlines()
    assert sum('"kind": "step"' in x for x in lines) == 3 and sum('"kind": "eval"' in x for x in lines) == 3


def test_simulate_command_with_config_and_flags(tmp_path):
    cfg = tmp_path / "sim.toml"
    cfg.write_text('seconds_per_step = 30\n[learner]\ngroups_per_step = 4\neval_every = 2\neval_size = 20\n'
                   '[sampler]\ngroup_size = 4\n'
                   '[[samplers]]\nname = "a"\ncount = 2\nweight_delay = { kind = "fixed", fixed_s = 60 }\n')
    metrics = tmp_path / "runs" / "m.jsonl"
    res = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--steps", "4", "--stale-loss", "grpo",
                                   "--metrics", str(metrics)])
    assert res.exit_code == 0, res.output
    assert "stale loss grpo" in res.output and "eval accuracy" in res.output
    import json
    steps = [json.loads(x) for x in metrics.read_text().splitlines() if '"step"' in x]
    assert [s["version"] for s in steps] == [1, 2, 3, 4]
    assert [s["staleness_mean"] for s in steps] == [0.0, 1.0, 0.0, 1.0]  # reload every 60 s = 2 steps


def test_engine_choice_fails_with_advice_not_a_traceback():
    from node.engines.vllm import vllm_available
    from node.models import BUILTIN_MODEL, load_tokenizer
    from node.runner import make_engine

    tok = load_tokenizer(BUILTIN_MODEL)
    with pytest.raises(SystemExit, match="use 'hf' or 'vllm'"):
        make_engine("sglang", BUILTIN_MODEL, tok)
    if not vllm_available():
        with pytest.raises(SystemExit, match="vLLM is not installed"):
            make_engine("vllm", BUILTIN_MODEL, tok)
    assert make_engine("hf", BUILTIN_MODEL, tok).model_id == BUILTIN_MODEL
