"""Tasks and verifiable rewards. `make_task` builds one from its typed config."""

from node.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from node.tasks.chain import ChainConfig, ChainTask, final_answer_match
from node.tasks.base import Problem, RewardFn, Task
from node.tasks.dataset import DatasetTask, DatasetTaskConfig
from node.tasks.rewards import exact_int_match, load_reward, math_verify_reward
from node.tasks.stream import PromptStream


def make_task(cfg: ArithmeticConfig | ChainConfig | DatasetTaskConfig, tokenizer=None) -> Task:
    """The task `cfg` describes. `tokenizer` (the model's) renders a dataset task's prompts with its
    chat template (node/tasks/dataset.py); the arithmetic task's prompts are plain text always."""
    if isinstance(cfg, ArithmeticConfig):
        return ArithmeticTask(cfg)
    if isinstance(cfg, ChainConfig):
        return ChainTask(cfg)
    return DatasetTask(cfg, tokenizer)


__all__ = [
    "ArithmeticConfig", "ArithmeticTask", "ChainConfig", "ChainTask", "DatasetTask", "final_answer_match", "DatasetTaskConfig", "Problem",
    "RewardFn", "Task", "exact_int_match", "load_reward", "make_task", "math_verify_reward",
    "PromptStream",
]
