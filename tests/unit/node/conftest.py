"""Fixtures the unit tests of node/ share."""

from __future__ import annotations

import pytest

from node.tasks import ArithmeticTask


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    """The arithmetic task at its defaults, for the in-memory learner and samplers
    (helpers/inmemory.py, `tiny_swarm(task=task)`): one a module, its problems made once."""
    return ArithmeticTask()
