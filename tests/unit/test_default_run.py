"""tests/conftest.py: a plain `python -m pytest` leaves out the integration tests and says so;
`--all`, `-m`, `-k` and named files run what they choose; where vLLM is not installed, its tests
are left out (not skipped) unless the run chose them. Each case runs real pytest in a subprocess on a
four-test project that uses this conftest: one fast test, one marked `integration`, one in an
integration/ folder beside the conftest, marked by where it is, and one marked `vllm`."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.repo import ROOT

HINT = "run them with `python -m pytest -m integration`"
VLLM_HERE = importlib.util.find_spec("vllm") is not None
"""In vLLM's environment its tests are never left out: there they run."""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("default_run")
    shutil.copy(ROOT / "tests" / "conftest.py", root / "conftest.py")
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: slow\n    vllm: needs vLLM\n")
    (root / "test_two.py").write_text(
        "import pytest\n\n"
        "def test_fast():\n    pass\n\n"
        "@pytest.mark.integration\ndef test_slow():\n    pass\n"
    )
    (root / "integration").mkdir()
    (root / "integration" / "test_wire.py").write_text("def test_wire():\n    pass\n")  # no marker: its folder's
    (root / "test_engine.py").write_text("import pytest\n\n@pytest.mark.vllm\ndef test_engine():\n    pass\n")
    return root


def _expect(passed: int, deselected: int, vllm_left_out: bool) -> dict[str, int]:
    """The counts, where the vLLM test the conftest leaves out runs instead if vLLM is installed."""
    if vllm_left_out and VLLM_HERE:
        passed, deselected = passed + 1, deselected - 1
    return {k: v for k, v in (("passed", passed), ("deselected", deselected)) if v}


def _run(project: Path, *args: str) -> tuple[dict[str, int], str]:
    """pytest's outcome counts ({'passed': 1, 'deselected': 1}) and its whole output."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=project, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|deselected|failed|skipped)", out)}
    return counts, out


@pytest.mark.parametrize("args", [(), (".",)], ids=["no-args", "a-directory"])
def test_the_default_run_leaves_out_integration_tests_and_says_how_to_run_them(project, args):
    counts, out = _run(project, *args)
    assert counts == _expect(1, 3, vllm_left_out=True), out
    assert "left out 2 integration tests" in out and HINT in out, out
    assert ("left out 1 vLLM test:" in out) is not VLLM_HERE, out


@pytest.mark.parametrize("args, expected", [
    (("--all",), _expect(3, 1, vllm_left_out=True)),  # everything this environment can run
    (("-m", "integration"), _expect(2, 2, vllm_left_out=False)),  # the fast one by -m, vLLM's by the conftest
    (("-m", "not integration"), _expect(1, 3, vllm_left_out=True)),
    (("-m", "vllm"), _expect(1, 3, vllm_left_out=False)),  # chosen: it runs (a vLLM test calls require_vllm)
    (("-k", "slow"), _expect(1, 3, vllm_left_out=False)),  # -k chooses: what it does not match, -k deselects
    (("test_two.py",), _expect(2, 0, vllm_left_out=False)),
    (("test_two.py::test_slow",), _expect(1, 0, vllm_left_out=False)),
    (("test_engine.py",), _expect(1, 0, vllm_left_out=False)),
])
def test_a_run_that_chooses_its_tests_runs_what_it_chose(project, args, expected):
    counts, out = _run(project, *args)
    assert counts == expected, out
    assert HINT not in out, out
