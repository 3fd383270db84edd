"""Every benchmark of node/ runs, at its smallest, as cleanrl runs its real scripts with tiny budgets:
a change that breaks one fails here, not when someone next reads docs/BENCHMARKS.md. Each prints
its figures beside their baseline; these check that it ran to its table, not the figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers.external import cannot, require_vllm
from helpers.repo import ROOT

PEAKS = Path("/proc/self/clear_refs")  # CPU peaks: Linux's VmHWM, reset through clear_refs


class Bench(NamedTuple):
    argv: list[str]
    shows: str  # a regex its table matches
    needs_peaks: bool = False  # measures CPU peak memory, so needs PEAKS


BENCHES = {
    "audit": Bench(["bench_audit.py", "--steps", "4", "--chosen", "8"], r"ms per audited group"),
    "bf16_audit": Bench(["bench_bf16_audit.py", "--preset", "smoke", "--models", "builtin", "--dtypes", "bfloat16"],
                        r"honest groups failed \(a margin past"),
    "filters": Bench(["bench_filters.py", "--vocab", "1024", "--rows", "8", "--repeats", "1"], r"ms a position"),
    "gepo_variance": Bench(["gepo_variance.py"], r"GEPO lower\n(\s+[\d.]+){4}\s+\d+%\n"),
    "learner_memory": Bench(["learner_memory.py", "--shape", "wide-vocab-tiny", "--layers", "1", "--versions", "1",
                             "--groups", "1", "--group-size", "2", "--completion-len", "16", "--threads", "1"],
                            r"v1: v1 rebuilt and loaded for an audit .* peak in phase .*\n"
                            r"(?s:.*)arithmetic \(docs/BENCHMARKS", needs_peaks=True),
    "learner": Bench(["bench_learner.py", "--shape", "builtin", "--groups", "2", "--steps", "1", "--sampler-prompts",
                      "2", "--sampler-tokens", "4"], r"learner / bare: \d+\.\d+x tokens/s", needs_peaks=True),
    "logprob_gap": Bench(["bench_logprob_gap.py", "--steps", "3", "--prompts", "4"], r"a liar claiming"),
    "losses": Bench(["bench_losses.py", "--reps", "2"], r"(?m)^grpo\s+\d"),
    "margin_tail": Bench(["bench_margin_tail.py", "--steps", "2", "--at", "2", "--groups", "1"],
                         r"pooled: \d+ of \d+ positions past the margin"),
    "picker": Bench(["bench_picker.py", "--batch", "4", "--vocab", "1024", "--steps", "2"], r"(?m)^\s+4\s+1024\s"),
    "reward_budget": Bench(["bench_reward_budget.py", "4"],
                           r"budget of a group of 8: [\d.]+ s; honest groups over it: \d+"),
    "sim_bf16": Bench(["bench_sim_bf16.py", "--batches", "1", "--prompts", "2"],
                      r"linear outputs that differ: \d+ of \d+"),
    "weights": Bench(["bench_weights.py", "--shape", "wide-vocab-tiny", "--algos", "grpo", "--steps", "2", "--groups",
                      "2", "--group-size", "2", "--prompt-len", "8", "--completion-len", "8"], r"mean: patch 1/"),
}


def run_bench(argv: list[str], timeout: float) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / argv[0]), *argv[1:]], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_a_node_benchmark_runs_to_its_table(name):
    bench = BENCHES[name]
    if bench.needs_peaks:
        cannot(None if PEAKS.exists() else f"needs Linux's {PEAKS} to measure peak memory")
    printed = run_bench(bench.argv, 600)
    assert re.search(bench.shows, printed), printed[-3000:]


@pytest.mark.vllm
def test_the_vllm_benchmark_runs_to_its_table():
    require_vllm()
    printed = run_bench(["bench_vllm.py", "--prompts", "4", "--group", "2", "--batches", "2"], 600)
    assert "node overhead over vllm direct" in printed, printed[-3000:]


PARSE_ONLY = """
import argparse, runpy, sys
parse = argparse.ArgumentParser.parse_args
def parsed(self, *args, **kwargs):  # the bench's own parser, then stop before any work
    namespace = parse(self, *args, **kwargs)
    print("parsed", sys.argv[0], flush=True)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parsed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


GPU_PARTS = {"honest-mid-bfloat16", "honest-big-bfloat16", "cost", "picker", "filters", "vllm", "learner", "audit"}
"""The parts of examples/gpu_figures.sh with FULL=1 (vLLM's where it imports)."""


@pytest.mark.parametrize("script, parts", [("gpu_figures.sh", GPU_PARTS), ("gpu_swarm.sh", GPU_PARTS | {"rehearsal"})])
def test_every_command_of_a_gpu_script_is_one_its_bench_accepts(tmp_path, script, parts):
    """examples/gpu_swarm.sh (which ends in gpu_figures.sh) is what a lent GPU's one device call
    runs: a flag a bench renamed would cost that call. The script runs here as written (FULL=1:
    every part), with `python3` a shim that gives each example's own parser the script's arguments
    and stops there (`-c` and `-m` run as they are), and `nvidia-smi` one that names no device;
    each part must exit 0 having been parsed. `python3 -c "import vllm"` is answered yes, so
    vLLM's command is asked too (bench_vllm.py imports vLLM only once it runs)."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (tmp_path / "parse_only.py").write_text(PARSE_ONLY)
    (shims / "python3").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -c ] && [ "$2" = "import vllm" ]; then exit 0; fi\n'
        f'if [ "$1" = -c ] || [ "$1" = -m ]; then exec {sys.executable} "$@"; fi\n'
        f'exec {sys.executable} {tmp_path / "parse_only.py"} "$@"\n')
    (shims / "nvidia-smi").write_text("#!/bin/sh\necho 'no GPU: the script rehearsed'\n")
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "FULL": "1", "DEVICE": "cpu",
           "WORK": str(tmp_path / "work"), "WHEELS": str(tmp_path / "no-wheels")}
    out = subprocess.run(["bash", str(ROOT / "examples" / script), str(tmp_path / "out")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    ran = dict(re.findall(r"(?m)^== (\S+): exit (\d+)", out.stdout))
    assert set(ran) == parts, (sorted(ran), out.stdout[-3000:], out.stderr[-3000:])
    assert set(ran.values()) == {"0"}, (ran, out.stdout[-3000:], out.stderr[-3000:])
    for name in parts:  # its own command's parser read its arguments
        section = out.stdout.split(f"== {name} (limit", 1)[1].split(f"== {name}: exit", 1)[0]
        assert re.search(r"(?m)^parsed examples/\S+\.py$", section), (name, section[-2000:])
