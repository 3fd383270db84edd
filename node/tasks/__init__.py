"""Tasks and verifiable rewards. `make_task` builds one from its typed config."""

from .arithmetic import ArithmeticConfig, ArithmeticTask
from .base import Problem, RewardFn, Task
from .dataset import DatasetTask, DatasetTaskConfig
from .rewards import exact_int_match, load_reward, math_verify_reward
from .stream import PromptStream


def make_task(cfg: ArithmeticConfig | DatasetTaskConfig) -> Task:
    if isinstance(cfg, ArithmeticConfig):
        return ArithmeticTask(cfg)
    return DatasetTask(cfg)


__all__ = [
    "ArithmeticConfig", "ArithmeticTask", "DatasetTask", "DatasetTaskConfig", "Problem",
    "RewardFn", "Task", "exact_int_match", "load_reward", "make_task", "math_verify_reward",
    "PromptStream",
]
