"""Why a rollout was refused or kept waiting: the closed sets every counter, reply and log line uses.

A `Drop` is final: the record is refused for good (the reply's `rejected`, the learner's `drops`
counter, the checkpoint's books). A `Busy` is not: the record was past a bound before anything
of it was read, and the sampler keeps it and sends it again later (the reply's `why`, the
learner's `throttled` counter). Both are str enums, so the wire, the metrics and the checkpoints
carry the same plain words as ever; one word, one meaning.
"""

from __future__ import annotations

import enum


class Drop(enum.StrEnum):
    """A record (or a whole batch, or a buffered group) refused for good, by the first check it failed."""

    # the record's bytes (swarm/wire/rollout.py, envelope.py, the learner's receiver)
    UNDECODABLE = "undecodable"
    OVERSIZE = "oversize"
    SCHEMA = "schema"
    SIZES = "sizes"
    NONFINITE = "nonfinite"
    PROTOCOL = "protocol"
    UNKNOWN_FIELDS = "unknown_fields"
    SIGNATURE = "signature"
    FORGED_SENDER = "forged_sender"
    INTERNAL_ERROR = "internal_error"
    """A check raised: a bug, never the sender's fault alone; logged with its traceback."""
    # a whole batch (batch.py): one count per batch
    BATCH_UNDECODABLE = "batch_undecodable"
    BATCH_SCHEMA = "batch_schema"
    BATCH_TOO_MANY = "batch_too_many"
    # what the learner makes of a record (node/learner/intake.py)
    REFUSED_SAMPLER = "refused_sampler"
    """Its sampler failed an audit: refused unread, and its buffered groups dropped."""
    WRONG_SWARM = "wrong_swarm"
    WRONG_TASK = "wrong_task"
    DUPLICATE = "duplicate"
    DUPLICATE_CONTENT = "duplicate_content"
    UNKNOWN_PROMPT = "unknown_prompt"
    UNKNOWN_MODEL = "unknown_model"
    FUTURE_VERSION = "future_version"
    UNPUBLISHED_VERSION = "unpublished_version"
    UNKNOWN_CHAIN = "unknown_chain"
    WRONG_GROUP_SIZE = "wrong_group_size"
    TOO_LONG = "too_long"
    WRONG_TEMPERATURE = "wrong_temperature"
    POSITIVE_LOGPROB = "positive_logprob"
    EMPTY_COMPLETION = "empty_completion"
    WRONG_TOKENIZER = "wrong_tokenizer"
    UNKNOWN_TOKENIZER = "unknown_tokenizer"
    TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
    TEXT_MISMATCH = "text_mismatch"
    FOREIGN_VERSION = "foreign_version"
    STALE = "stale"
    """More than `max_staleness` versions old: the one meaning of "stale" (a drop, never a route)."""
    # what the learner does with an accepted one (node/learner/learner.py)
    QUARANTINED = "quarantined"
    OWN_DROPPED = "own_dropped"
    FOREIGN_DROPPED = "foreign_dropped"
    FOREIGN_UNPAIRED = "foreign_unpaired"
    """Another model's group that waited with none of our model's to share a step with, while
    unproven keys' groups filled their pool: dropped, oldest first, to make room (GroupBuffer.drop_unpaired)."""
    BUFFER_FULL = "buffer_full"
    SCORING_TIME = "scoring_time"
    REWARD_BUDGET = "reward_budget"
    LOGPROB_GAP = "logprob_gap"


class Busy(enum.StrEnum):
    """The bound a sampler's record (or call) met at the learner's door: sent again later."""

    CONCURRENT = "concurrent"
    RATE = "rate"
    QUOTA = "quota"
    JOURNAL_BYTES = "journal_bytes"
    BYTES = "bytes"
    UNPROVEN_QUOTA = "unproven_quota"
    UNPROVEN_JOURNAL_BYTES = "unproven_journal_bytes"
    UNPROVEN_RATE = "unproven_rate"
    UNPROVEN_BYTES = "unproven_bytes"
