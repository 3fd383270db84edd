"""A task from local question/answer files (JSONL or Parquet), scored by math-verify.

For users with real models and real data (GSM8K- or MATH-style files they have on disk). Files
are read through `datasets`, which never touches the hub for local paths.

Instruct models get their prompts in their own chat format: given the model's tokenizer, a
problem's prompt is the tokenizer's chat template rendered as text (an optional system message,
the user message `prompt_template` makes of the question, the assistant's generation prompt;
template options such as Qwen3's `enable_thinking` passed through). It is text, not token ids,
because every engine and the learner tokenize prompt text with `add_special_tokens=False`: the
rendered text holds whatever BOS the template emits, and nothing adds another. Problem ids hash
the question only, so they do not depend on the template or the model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from node.tasks.base import Problem, SplitTask
from node.tasks.rewards import load_reward

DEFAULT_TEMPLATE = "{question}\nPut the final answer in \\boxed{{}}.\n"
CHAT_TEMPLATE_MODES = ("auto", "on", "off")
_RESERVED_TEMPLATE_OPTIONS = {"conversation", "tokenize", "add_generation_prompt", "continue_final_message",
                              "return_dict", "return_tensors", "chat_template", "tools", "documents"}


@dataclass(frozen=True)
class DatasetTaskConfig:
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...] = ()
    """Held-out files; when empty, `eval_fraction` of the train files is held out by hash."""
    question_field: str = "question"
    answer_field: str = "answer"
    prompt_template: str = DEFAULT_TEMPLATE
    """The question as a prompt (`{question}` is replaced); with a chat template, the user message
    (surrounding blanks stripped)."""
    chat_template: str = "auto"
    """Render prompts with the model tokenizer's chat template: 'auto' when the tokenizer has one
    (instruct models do, base models mostly not), 'on' (a tokenizer without one is an error),
    'off' (the plain `prompt_template` text)."""
    system_prompt: str = ""
    """System message of the chat; none when empty."""
    template_options: dict[str, Any] = field(default_factory=dict)
    """Passed to the chat template, e.g. {enable_thinking = false} for Qwen3."""
    reward: str = "math_verify"
    eval_fraction: float = 0.05
    name: str = field(default="")

    def __post_init__(self) -> None:
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise ValueError(f"dataset task: chat_template must be one of {CHAT_TEMPLATE_MODES}, "
                             f"not {self.chat_template!r}")
        reserved = _RESERVED_TEMPLATE_OPTIONS & set(self.template_options)
        if reserved:
            raise ValueError(f"dataset task: template_options may not set {sorted(reserved)} (the task sets them)")
        if not self.train_files:
            raise ValueError("dataset task: give at least one train file (.jsonl, .json or .parquet)")
        for f in (*self.train_files, *self.eval_files):
            if Path(f).suffix not in {".jsonl", ".json", ".parquet"}:
                raise ValueError(f"dataset task: {f} is not .jsonl, .json or .parquet")
            if not Path(f).is_file():
                raise ValueError(f"dataset task: file {f} does not exist (paths are relative to the "
                                 f"folder you run hetero-node in)")


def _load_rows(files: Sequence[str], q: str, a: str) -> list[tuple[str, str]]:
    import datasets  # lazy: heavy import

    kind = "parquet" if Path(files[0]).suffix == ".parquet" else "json"
    ds = datasets.load_dataset(kind, data_files=list(files), split="train")
    missing = {q, a} - set(ds.column_names)
    if missing:
        raise ValueError(f"dataset task: {files} lack the field(s) {sorted(missing)}; "
                         f"they have {ds.column_names} (set question_field/answer_field)")
    return [(str(r[q]), str(r[a])) for r in ds]


def _problem_id(question: str) -> str:
    return "ds:" + hashlib.blake2b(question.encode(), digest_size=10).hexdigest()


class DatasetTask(SplitTask):
    def __init__(self, cfg: DatasetTaskConfig, tokenizer=None) -> None:
        """`tokenizer`: the model's, for its chat template (see the module docstring); without
        one, prompts are the plain `prompt_template` text."""
        self.cfg = cfg
        self.name = cfg.name or Path(cfg.train_files[0]).stem
        self._reward = load_reward(cfg.reward)
        self.reward_name = cfg.reward
        """What a learner's reward worker loads: its rewards of a peer's text are bounded in time
        (node/tasks/bounded.py), whatever the reward (math-verify's or a user's)."""
        has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
        if cfg.chat_template == "on" and not has_template:
            raise ValueError("dataset task: chat_template = 'on' but " + (
                "no tokenizer was given to the task" if tokenizer is None else "the model's tokenizer has no chat "
                "template") + "; use 'auto' or 'off' for plain prompts")
        self.tokenizer = tokenizer if has_template and cfg.chat_template != "off" else None
        """The tokenizer whose chat template renders prompts, or None (plain `prompt_template`)."""

    def render(self, question: str) -> str:
        """The prompt text of a question: the rendered chat, or the plain template."""
        text = self.cfg.prompt_template.format(question=question)
        if self.tokenizer is None:
            return text
        messages = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        messages.append({"role": "user", "content": text.strip()})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  **self.cfg.template_options)

    def _to_problems(self, rows: list[tuple[str, str]]) -> list[Problem]:
        return [Problem(_problem_id(q), self.render(q), a) for q, a in rows]

    def _load_splits(self) -> dict[str, list[Problem]]:
        c = self.cfg
        train = self._to_problems(_load_rows(c.train_files, c.question_field, c.answer_field))
        if c.eval_files:
            held = self._to_problems(_load_rows(c.eval_files, c.question_field, c.answer_field))
            held_ids = {p.id for p in held}
            return {"train": [p for p in train if p.id not in held_ids], "eval": held}
        cut = int(c.eval_fraction * 2**32)
        is_eval = [int(p.id[3:11], 16) < cut for p in train]
        return {"train": [p for p, e in zip(train, is_eval) if not e],
                "eval": [p for p, e in zip(train, is_eval) if e]}

    def reward(self, completion: str, answer: str) -> float:
        return self._reward(completion, answer)
