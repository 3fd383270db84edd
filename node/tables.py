"""The tables every command reads with the same meaning (`TablesBlock`): `[task]`, `[sampling]` and
`[learner]`, composed into each command's root with the blocks of node/config.py.

Apart from node/config.py because `[learner]` brings the learner's config (and torch) with it, and
the loader must stay light enough for `hetero-node --help`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.config import Block, TaskConfig
from node.learner.config import LearnerConfig
from node.sampling.params import SamplingConfig
from node.tasks import ArithmeticConfig


@dataclass(kw_only=True)
class TablesBlock(Block):
    task: TaskConfig = field(default_factory=ArithmeticConfig)
    """What the swarm learns: problems, a split and a verifiable reward (node/tasks)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
