"""tests/conftest.py: a plain `python -m pytest` leaves out the integration tests and says so;
`--all`, `-m`, `-k` and named files run what they choose. Each case runs real pytest in a
subprocess on a three-test project that uses this conftest: one fast test, one marked `integration`,
and one in an integration/ folder beside the conftest, marked by where it is."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.repo import ROOT

HINT = "run them with `python -m pytest -m integration`"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("default_run")
    shutil.copy(ROOT / "tests" / "conftest.py", root / "conftest.py")
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: slow\n")
    (root / "test_two.py").write_text(
        "import pytest\n\n"
        "def test_fast():\n    pass\n\n"
        "@pytest.mark.integration\ndef test_slow():\n    pass\n"
    )
    (root / "integration").mkdir()
    (root / "integration" / "test_wire.py").write_text("def test_wire():\n    pass\n")  # no marker: its folder's
    return root


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
    assert counts == {"passed": 1, "deselected": 2}, out
    assert "left out 2 integration tests" in out and HINT in out, out


@pytest.mark.parametrize("args, expected", [
    (("--all",), {"passed": 3}),
    (("-m", "integration"), {"passed": 2, "deselected": 1}),
    (("-m", "not integration"), {"passed": 1, "deselected": 2}),
    (("-k", "slow"), {"passed": 1, "deselected": 2}),
    (("test_two.py",), {"passed": 2}),
    (("test_two.py::test_slow",), {"passed": 1}),
])
def test_a_run_that_chooses_its_tests_runs_what_it_chose(project, args, expected):
    counts, out = _run(project, *args)
    assert counts == expected, out
    assert HINT not in out, out
