"""The learner's checks of a decoded record, after swarm.wire.rollout' structural ones: is it work this
learner can take at all? Nothing a sampler claims is believed without one of these checks, or an
audit later (node/audit/auditor.py).

`RecordChecks` owns what the checks remember (the ids and contents of accepted groups, for
duplicates) and the foreign tokenizers it decodes with; `Chains` owns which version chains are
this learner's. Each check returns a drop reason (a short code, counted) or None.
"""

from __future__ import annotations

import array
import collections
import hashlib
import math
from typing import Any

from swarm.wire.rollout import RolloutGroup

from node.audit.refusals import RefusalList
from node.audit.archive import VersionArchive
from node.config import ConfigError
from node.sampling.params import SamplingConfig
from node.models import tokenizer_hash
from node.tasks import Task
from node.learner.config import LearnerConfig
from swarm.wire.reasons import Drop

MAX_CHARS_PER_TOKEN = 64
"""Bound on a completion's text per token (the longest tokens of real vocabularies are far shorter)."""
MAX_RETOKENIZED = 4
"""A foreign completion, re-tokenized in ours (node/learner/scoring.py), may be at most this many
times the swarm's `max_new_tokens`: what a learner's step is sized for. Honest text re-tokenizes
within ~1-3x between real tokenizers (English ~1-1.3x; Chinese text of a Qwen-like vocabulary in a
Llama-2-like one ~2-3x); crafted text, one foreign token of 64 characters per token of ours each,
would be 64x: a step's activations sized for max_new_tokens, times 64."""
MAX_CHAINS = 16
"""Earlier runs' chains remembered (their rollouts may still arrive from samplers' outboxes)."""
MAX_SEEN = 200_000
"""Accepted ids (and contents) remembered for the duplicate checks: older duplicates are caught as stale."""


class Chains:
    """This run's chain id, and earlier runs' chains (from checkpoints) -> the last version each
    reached: their rollouts are sound; rollouts of any other chain are refused."""

    def __init__(self, this: str) -> None:
        self.this = this
        self.earlier: dict[str, int] = {}

    def state_dict(self, version: int) -> dict[str, int]:
        """Every chain this learner has run, this one at `version`, the newest `MAX_CHAINS`."""
        return dict(list({**self.earlier, self.this: version}.items())[-MAX_CHAINS:])

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.earlier = dict(state)


class RecordChecks:
    def __init__(self, cfg: LearnerConfig, tokenizer, task: Task, sampling: SamplingConfig, *, model_id: str,
                 swarm: str, chains: Chains, archive: VersionArchive, refusals: RefusalList) -> None:
        self.cfg, self.tok, self.task, self.sampling = cfg, tokenizer, task, sampling
        self.model_id, self.swarm = model_id, swarm
        self.chains, self.archive, self.refusals = chains, archive, refusals
        self.tokenizer_id = tokenizer_hash(tokenizer)
        self.vocab_size = len(tokenizer)
        self.foreign_toks = {model: _local_tokenizer(path) for model, path in cfg.foreign.tokenizers.items()}
        """model id -> (its tokenizer, its hash), for checking foreign rollouts' text."""
        self.seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.seen_content: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Content keys (prompt + every completion's tokens, in any order) of accepted groups."""

    def checked_as_own(self, g: RolloutGroup) -> bool:
        """Whether `g` is checked as our model's (audits, gap check, version, staleness): ours, or
        in our tokenizer under a model id the operator did not name, whose label proves nothing."""
        return g.model_id == self.model_id or (g.tokenizer == self.tokenizer_id
                                               and g.model_id not in self.cfg.foreign.accept_models)

    def other_tokenizer_models(self) -> set[str]:
        """Models of `foreign_tokenizers` whose tokenizer differs from ours."""
        return {m for m, (_, h) in self.foreign_toks.items() if h != self.tokenizer_id}

    def check(self, g: RolloutGroup, version: int, published: int) -> Drop | None:
        """A drop reason for `g`, or None, at the learner's `version` having `published` its newest."""
        own = self.checked_as_own(g)
        reason = (self._check_origin(g) or (own and self._check_version(g, version, published) or None)
                  or self._check_shape(g) or self._check_tokens(g, own))
        if reason is not None:
            return reason
        if not own:
            return _foreign_version(g, self.chains)
        return Drop.STALE if version - g.version > self.cfg.max_staleness else None

    def _check_origin(self, g: RolloutGroup) -> Drop | None:
        """Who sent it, for which swarm, task and prompt, of which model, and whether it is new."""
        if g.sampler in self.refusals:
            return Drop.REFUSED_SAMPLER  # failed an audit: nothing of it is taken, ever
        if g.swarm != self.swarm:
            return Drop.WRONG_SWARM
        if g.task != self.task.name:
            return Drop.WRONG_TASK
        if g.id in self.seen:
            return Drop.DUPLICATE
        if content_key(g) in self.seen_content:
            return Drop.DUPLICATE_CONTENT  # the same completions under a new id earn nothing twice
        problem = self.task.get(g.prompt_id)
        if problem is None or problem.prompt != g.prompt:
            return Drop.UNKNOWN_PROMPT
        accepted = self.cfg.foreign.accept_models
        if g.model_id != self.model_id and "*" not in accepted and g.model_id not in accepted:
            return Drop.UNKNOWN_MODEL
        return None

    def _check_version(self, g: RolloutGroup, version: int, published: int) -> Drop | None:
        """A version of this run's chain we have published, of an earlier run's chain up to where
        it got, or version 0 of no chain (a sampler that has not loaded weights yet)."""
        if g.chain == "":
            return None if g.version == 0 else Drop.FUTURE_VERSION
        if g.chain == self.chains.this:
            if g.version > published:
                return Drop.FUTURE_VERSION
            # versions between published ones (publish cadence) were never sent: no sampler held one
            recent = version - g.version <= self.cfg.max_staleness
            return Drop.UNPUBLISHED_VERSION if recent and not self.archive.holds(g.chain, g.version) else None
        last = self.chains.earlier.get(g.chain)
        if last is None:
            return Drop.UNKNOWN_CHAIN  # not a chain this learner ever ran: forged or another learner's
        return Drop.FUTURE_VERSION if g.version > last else None

    def _check_shape(self, g: RolloutGroup) -> Drop | None:
        """The swarm's sampling settings: group size, length, temperature, log-probs' sign."""
        if len(g.completions) != self.sampling.group_size:
            return Drop.WRONG_GROUP_SIZE
        too_long = self.sampling.max_new_tokens
        if any(len(c.token_ids) > too_long or len(c.text) > MAX_CHARS_PER_TOKEN * too_long for c in g.completions):
            return Drop.TOO_LONG
        if not math.isclose(float(g.sampling.get("temperature", -1)), self.sampling.temperature):
            return Drop.WRONG_TEMPERATURE
        if any(lp > 1e-4 for c in g.completions for lp in c.logprobs):
            return Drop.POSITIVE_LOGPROB
        if any(not c.token_ids for c in g.completions):
            return Drop.EMPTY_COMPLETION
        return None

    def _check_tokens(self, g: RolloutGroup, own: bool) -> Drop | None:
        """The tokens decode, in a tokenizer we hold, to exactly the text the reward is computed on."""
        if g.tokenizer == self.tokenizer_id:
            tok, vocab = self.tok, self.vocab_size
        elif own:
            return Drop.WRONG_TOKENIZER
        else:
            known = self.foreign_toks.get(g.model_id)
            if known is None or known[1] != g.tokenizer:
                return Drop.UNKNOWN_TOKENIZER  # tokens we cannot decode: the text would be unchecked
            tok, vocab = known[0], len(known[0])
        if any(t >= vocab for c in g.completions for t in c.token_ids):
            return Drop.TOKEN_OUT_OF_VOCAB
        if any(tok.decode(c.token_ids, skip_special_tokens=True) != c.text for c in g.completions):
            return Drop.TEXT_MISMATCH
        if tok is not self.tok:  # trained on as our tokens: their count, not the sender's, is what a step costs
            most = MAX_RETOKENIZED * self.sampling.max_new_tokens
            if any(len(self.tok(c.text, add_special_tokens=False)["input_ids"]) > most for c in g.completions):
                return Drop.TOO_LONG
        return None

    def remember(self, g: RolloutGroup) -> None:
        """`g` was accepted: its id and its content are duplicates from now on (bounded memory)."""
        self.seen[g.id] = None
        self.seen_content[content_key(g)] = None
        for seen in (self.seen, self.seen_content):
            while len(seen) > MAX_SEEN:
                seen.popitem(last=False)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": list(self.seen), "seen_content": list(self.seen_content)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = collections.OrderedDict.fromkeys(state["seen"])
        self.seen_content = collections.OrderedDict.fromkeys(state["seen_content"])


def _foreign_version(g: RolloutGroup, chains: Chains) -> Drop | None:
    """A foreign generator never ran our weights: it may name its own learner's chain and version (a
    partner's, in a swarm of several learners: we can check neither and use neither), never one of
    ours (this run's chain, or an earlier run's)."""
    return Drop.FOREIGN_VERSION if g.chain and (g.chain == chains.this or g.chain in chains.earlier) else None


def content_key(g: RolloutGroup) -> str:
    """What a group *is*, whatever its id: its prompt and its completions' tokens, in any order."""
    h = hashlib.blake2b(digest_size=16)
    h.update(g.prompt_id.encode())
    for tokens in sorted(array.array("Q", c.token_ids).tobytes() for c in g.completions):
        h.update(len(tokens).to_bytes(8, "little") + tokens)
    return h.hexdigest()


def _local_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"learner.foreign.tokenizers: cannot load a tokenizer from {path!r} ({type(e).__name__})",
                          "give a local folder saved with save_pretrained that holds the model's tokenizer") from None
    return tok, tokenizer_hash(tok)
