"""The default run is the fast one: `python -m pytest` leaves out the integration tests.

A newcomer's first command should answer in minutes, not after 20 minutes of real swarms and
training, and should say what it left out. So when the run selects nothing itself (no `-m`, no
`-k`, no test file or test id named; directories such as `tests/` or `tests/unit/` count as the
whole suite, while tests/integration/ or a folder in it chooses its tests), tests marked
`integration` are deselected and the terminal summary says how many, with the command that runs
them. `--all` runs everything; `-m integration` runs only them; naming a file or a test
(`python -m pytest tests/integration/swarm/test_swarm.py -k forged`) runs exactly what was named.
CI (.ci/run) runs the default command and then `-m integration`.

The tree says which tests are which: every test under tests/integration/ is marked `integration`
here, so its files need no marker of their own, and tests/unit/ holds the fast ones; each is
divided by the layer its tests are about (swarm/, node/, cli/).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Measured on 2-core CPUs (docs/BENCHMARKS.md, "The test suite and CI"): the whole main suite took
# 1322 s from a clean clone on one; the integration tests alone 45.6 min on an AMD EPYC without AVX-512.
INTEGRATION_TIME = "20-50 minutes on a 2-core CPU"

_deselected = pytest.StashKey[int]()
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


@pytest.hookimpl(tryfirst=True)  # marked before -m selects (the mark plugin's own modifyitems)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the tree says which tests are integration tests
        if item.path.resolve().is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
    if config.getoption("--all") or _names_tests(config):
        return
    slow = [item for item in items if item.get_closest_marker("integration")]
    if not slow:
        return
    items[:] = [item for item in items if not item.get_closest_marker("integration")]
    config.hook.pytest_deselected(items=slow)
    config.stash[_deselected] = len(slow)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    left_out = config.stash.get(_deselected, 0)
    if left_out:
        terminalreporter.write_line(
            f"left out {left_out} integration tests (real processes and training, "
            f"{INTEGRATION_TIME}): run them with `python -m pytest -m integration`, "
            "or everything with `python -m pytest --all`"
        )
