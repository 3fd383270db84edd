"""The default run is the fast one: `python -m pytest` leaves out the integration tests.

A newcomer's first command should answer in minutes, not after 20 minutes of real swarms and
training, and should say what it left out. So when the run selects nothing itself (no `-m`, no
`-k`, no test file or test id named; directories such as `tests/` or `tests/unit/` count as the
whole suite, while tests/integration/ or a folder in it chooses its tests), tests marked
`integration` are deselected and the terminal summary says how many, with the command that runs
them. `--all` runs everything; `-m integration` runs only them; naming a file or a test
(`python -m pytest tests/integration/swarm/test_swarm.py -k forged`) runs exactly what was named.
CI (.ci/run) runs the default command and then `-m integration`.

Tests marked `vllm` need vLLM, which lives in its own environment (README, "vLLM"): where it is
not installed, a run that does not choose them (`-m` naming vllm, `-k`, or a test file or id) leaves
them out and says so, rather than collecting them to skip, so that no test skips in CI's main runs.
CI runs them in the vLLM environment with `-m vllm`, where a missing vLLM fails
(tests/helpers/external.py, require_vllm).

The tree says which tests are which: every test under tests/integration/ is marked `integration`
here, so its files need no marker of their own, and tests/unit/ holds the fast ones; each is
divided by the layer its tests are about (swarm/, node/, cli/).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# Measured on 2-core CPUs (docs/BENCHMARKS.md, "The test suite and CI"): the integration tests
# alone took 50.7 min on an AMD EPYC without AVX-512.
INTEGRATION_TIME = "about 50 minutes on a 2-core CPU"

_deselected = pytest.StashKey[int]()
_vllm_left_out = pytest.StashKey[int]()
INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        help="also run the integration tests (real processes, real training; "
        "the default run leaves them out)",
    )


def _names_tests(config: pytest.Config) -> bool:
    """Whether the command line itself chose tests: -m, -k, a test file or id, or a folder of
    integration tests (tests/integration/ or one inside it)."""
    if config.option.markexpr or config.option.keyword:
        return True
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return False
    return any("::" in arg or not Path(arg).is_dir() or Path(arg).resolve().is_relative_to(INTEGRATION)
               for arg in config.args)


def _chooses_vllm(config: pytest.Config) -> bool:
    """Whether the command line chose vLLM's tests itself: `-m` naming vllm, `-k`, or a test file or id."""
    if "vllm" in (config.option.markexpr or "") or config.option.keyword:
        return True
    return config.args_source is pytest.Config.ArgsSource.ARGS and any(
        "::" in arg or not Path(arg).is_dir() for arg in config.args)


def _leave_out(config: pytest.Config, items: list[pytest.Item], marker: str) -> int:
    """Deselect the tests carrying `marker`; how many."""
    out = [item for item in items if item.get_closest_marker(marker)]
    if out:
        items[:] = [item for item in items if not item.get_closest_marker(marker)]
        config.hook.pytest_deselected(items=out)
    return len(out)


@pytest.hookimpl(tryfirst=True)  # marked before -m selects (the mark plugin's own modifyitems)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the tree says which tests are integration tests
        if item.path.resolve().is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
    # find_spec, not an import: vLLM's import takes seconds, and a broken install is require_vllm's to report
    if importlib.util.find_spec("vllm") is None and not _chooses_vllm(config):
        config.stash[_vllm_left_out] = _leave_out(config, items, "vllm")
    if config.getoption("--all") or _names_tests(config):
        return
    config.stash[_deselected] = _leave_out(config, items, "integration")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    vllm = config.stash.get(_vllm_left_out, 0)
    if vllm:
        terminalreporter.write_line(
            f"left out {vllm} vLLM test{'s' if vllm != 1 else ''}: vLLM is not installed here; they run in its "
            "own environment with `python -m pytest -m vllm` (README, section 'vLLM')"
        )
    left_out = config.stash.get(_deselected, 0)
    if left_out:
        terminalreporter.write_line(
            f"left out {left_out} integration tests (real processes and training, "
            f"{INTEGRATION_TIME}): run them with `python -m pytest -m integration`, "
            "or everything with `python -m pytest --all`"
        )
