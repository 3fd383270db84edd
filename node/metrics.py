"""Metrics sink: one JSON object per line (the source of truth) plus optional TensorBoard scalars.

The JSONL file is what every tool here reads back (`read_metrics`, `hetero-node plot`), so it is
written first, whole, and flushed after every record: a crash loses no record already written,
and at worst leaves one torn last line, which `read_metrics` skips. TensorBoard is a second,
optional view of the same records for users who already live in it.

TensorBoard tags (global_step = the record's "version"):
  * step records (`kind == "step"`, or no kind): `train/<key>` for every finite number, nested
    dicts flattened with "/": `train/loss`, `train/drops/stale`, `train/routes/stale/loss`,
    `train/routes/foreign/is_weight_mean`, ...;
  * eval records: `eval/<key>`, e.g. `eval/eval_acc`; any other kind K: `K/<key>`;
  * `staleness_hist` ({"staleness": count}) becomes one TensorBoard *histogram*,
    `train/staleness_hist`, with one bucket per staleness value: it is a distribution, and one
    scalar tag per staleness value would scatter it over up to `max_staleness` charts;
  * `accepted_by_sampler` ({peer_id: groups}) is kept in the JSONL only: one tag per peer grows
    without bound in a swarm and TensorBoard cannot compare peers across runs anyway;
  * `kind`, `version` and `step` are not logged (the step is the x axis), nor wall-clock times
    (`at`, `held_at`, `weights_published_at`: they line up the records of several processes), nor an eval record's
    `time_s` (the step record of the same version has it, as `train/time_s`);
  * NaN/inf (e.g. the loss of a skipped step), strings, lists and None are not logged to
    TensorBoard (a NaN point makes TensorBoard's charts unreadable); the JSONL keeps them as they
    are (NaN is written as `NaN`, which Python's json reads back). A string worth charting has a
    numeric twin: `weights_kind` ("keyframe" | "patch") is `train/weights_keyframe` (1 | 0).

Converting an existing run:  `with MetricsWriter(None, tb_dir) as w: [w.write(r) for r in
read_metrics(path)]`.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import numbers
import threading
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)


class Kind(enum.StrEnum):
    """What a metrics record is (its `Metric.KIND`)."""

    STEP = "step"
    """A learner's (or the local loop's) optimizer step."""
    EVAL = "eval"
    """A held-out evaluation of a version."""
    BATCH = "batch"
    """A sampler's batch of groups."""
    WEIGHTS = "weights"
    """A sampler's fetch of a version."""


class Metric(enum.StrEnum):
    """The keys of metric records that are read beyond the code that writes them (the CLI's plots,
    progress and summaries, the tally's eval, examples and tests). str values: the JSONL is unchanged."""

    KIND = "kind"
    VERSION = "version"
    STEP = "step"
    """The x axis of records from before `version` was (cli/plot.py reads either)."""
    TIME_S = "time_s"
    PHASE_S = "phase_s"
    """A learner's seconds per phase since it started (node/learner/phases.py)."""
    EVAL_ACC = "eval_acc"
    REWARD = "reward"
    LOSS = "loss"
    GRAD_NORM = "grad_norm"
    STALENESS_MEAN = "staleness_mean"
    STALENESS_HIST = "staleness_hist"
    KL_K3 = "kl_k3"
    CLIP_FRAC = "clip_frac"
    IS_WEIGHT_VAR = "is_weight_var"
    DROPS = "drops"
    ACCEPTED_BY_SAMPLER = "accepted_by_sampler"
    CREDITED = "credited"
    GROUPS_FOREIGN = "groups_foreign"
    GROUPS_SKIPPED_ZERO_VAR = "groups_skipped_zero_var"
    WEIGHTS_KIND = "weights_kind"
    WEIGHTS_BYTES_VS_VIEW = "weights_bytes_vs_view"
    AT = "at"
    HELD_AT = "held_at"
    WEIGHTS_PUBLISHED_AT = "weights_published_at"


KIND_PREFIX = {"step": "train", "eval": "eval"}
"""TensorBoard tag prefix per record kind; other kinds use their own name."""
NOT_LOGGED = frozenset({"kind", "version", "step", "at", "held_at", "weights_published_at"})
"""Keys that identify a record rather than measure something (wall-clock times among them: they
line records of several processes up); never TensorBoard scalars."""
NOT_LOGGED_BY_KIND = {"eval": frozenset({"time_s"})}
PER_PEER = frozenset({"accepted_by_sampler", "credited"})
"""Dicts keyed by peer id (the top 32 of each step, node/learner/books.py): a tag per peer id that
ever appeared would pile up in TensorBoard, so JSONL only."""
HISTOGRAMS = frozenset({"staleness_hist"})
"""Dicts {integer value: count} written as one TensorBoard histogram each."""


class MetricsWriter:
    """Appends metric records to a JSONL file and, optionally, TensorBoard event files.

    `jsonl_path=None` writes no JSONL (e.g. to convert an existing file to TensorBoard);
    `tensorboard_dir=None` (the default) writes no TensorBoard and does not import it, so the
    TensorBoard dependency is only needed by those who ask for it. Safe to call from several
    threads. Use as a context manager or call `close()`.
    """

    def __init__(self, jsonl_path: str | Path | None, tensorboard_dir: str | Path | None = None) -> None:
        self.jsonl_path = Path(jsonl_path) if jsonl_path is not None else None
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir is not None else None
        self._lock = threading.Lock()
        self._closed = False
        self._last_step = 0
        self._warned_no_step = False
        self._file = None
        self._tb = None
        if self.jsonl_path is not None:
            self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.jsonl_path, "a", encoding="utf-8")
        if self.tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # torch is a dependency; the tensorboard package may not be
                raise ImportError("TensorBoard output needs the tensorboard package: pip install tensorboard") from e
            self.tensorboard_dir.mkdir(parents=True, exist_ok=True)
            # flush_secs: the JSONL is the durable record; TensorBoard only needs to be fresh enough to watch.
            self._tb = SummaryWriter(log_dir=str(self.tensorboard_dir), flush_secs=10)

    def write(self, rec: dict[str, Any]) -> None:
        """Append `rec` as one JSON line (flushed), then log its numbers to TensorBoard if enabled."""
        if not isinstance(rec, dict):
            raise TypeError(f"metrics record must be a dict, got {type(rec).__name__}")
        line = json.dumps(rec, default=_jsonable)
        with self._lock:
            if self._closed:
                raise ValueError("MetricsWriter is closed")
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()
            if self._tb is not None:
                self._write_tensorboard(rec)

    def _global_step(self, rec: dict[str, Any]) -> int:
        for key in ("version", "step"):  # "step": records written before "version" was the common key
            value = rec.get(key)
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
                self._last_step = int(value)
                return self._last_step
        if not self._warned_no_step:
            log.warning("metrics record without a 'version'; TensorBoard uses the last seen one (%d)", self._last_step)
            self._warned_no_step = True
        return self._last_step

    def _write_tensorboard(self, rec: dict[str, Any]) -> None:
        kind = str(rec.get("kind", "step"))
        prefix = KIND_PREFIX.get(kind, kind)
        step = self._global_step(rec)
        skip = NOT_LOGGED | NOT_LOGGED_BY_KIND.get(kind, frozenset())
        for key, value in rec.items():
            if key in skip or key in PER_PEER:
                continue
            if key in HISTOGRAMS and isinstance(value, dict):
                self._write_histogram(f"{prefix}/{key}", value, step)
                continue
            for tag, number in _flatten(f"{prefix}/{key}", value):
                self._tb.add_scalar(tag, number, global_step=step)

    def _write_histogram(self, tag: str, counts: dict, step: int) -> None:
        """{value: count} with integer values -> one bucket per integer from min to max."""
        try:
            hist = {int(k): int(v) for k, v in counts.items() if int(v) > 0}
        except (TypeError, ValueError):
            log.debug("%s is not {integer: count}; not logged to TensorBoard", tag)
            return
        if not hist:
            return  # TensorBoard refuses an empty histogram
        lo, hi = min(hist), max(hist)
        values = range(lo, hi + 1)
        self._tb.add_histogram_raw(
            tag, min=lo, max=hi, num=sum(hist.values()),
            sum=sum(k * c for k, c in hist.items()), sum_squares=sum(k * k * c for k, c in hist.items()),
            bucket_limits=[v + 0.5 for v in values], bucket_counts=[hist.get(v, 0) for v in values],
            global_step=step)

    def flush(self) -> None:
        """Push buffered TensorBoard events to disk (the JSONL is already flushed per record)."""
        with self._lock:
            if self._tb is not None and not self._closed:
                self._tb.flush()

    def close(self) -> None:
        """Flush and close both outputs; calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._file is not None:
                self._file.close()
            if self._tb is not None:
                self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _flatten(tag: str, value: Any) -> Iterator[tuple[str, float]]:
    """(tag, number) for every finite number in `value`, nested dicts joined with "/"."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _flatten(f"{tag}/{key}", sub)
    elif isinstance(value, numbers.Real):  # bools count (0/1); numpy scalars are Real too
        number = float(value)
        if math.isfinite(number):
            yield tag, number


def _jsonable(obj: Any) -> Any:
    """json.dumps fallback for numpy/torch scalars and arrays (`.item()` / `.tolist()`)."""
    for method in ("item", "tolist"):
        fn = getattr(obj, method, None)
        if callable(fn):
            try:
                return fn()
            except (TypeError, ValueError, RuntimeError):  # e.g. .item() of a many-element tensor
                continue
    raise TypeError(f"metrics: {type(obj).__name__} is not JSON serializable")


def read_metrics(path: str | Path, skipped: list[int] | None = None) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file, in file order.

    A torn last line (the writer crashed or is writing it right now) is skipped quietly; a bad
    line elsewhere, or a line that is not a JSON object, is skipped, so one damaged record does not
    hide a whole run: their line numbers are appended to `skipped`, or, without it, named in one
    warning. Raises FileNotFoundError if `path` does not exist.
    """
    path = Path(path)
    with open(path, encoding="utf-8", errors="replace") as f:  # a torn multi-byte char must not fail the file
        lines = f.read().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                log.debug("%s: torn last line skipped", path)
            else:
                bad.append(i + 1)
            continue
        if not isinstance(rec, dict):
            bad.append(i + 1)
            continue
        records.append(rec)
    if skipped is not None:
        skipped.extend(bad)
    elif bad:
        log.warning("%s: %s", path, skipped_lines(bad))
    return records


def skipped_lines(lines: list[int], shown: int = 5) -> str:
    """One phrase for the lines `read_metrics` skipped: "2 lines skipped, not JSON objects (lines 3, 9)"."""
    more = f", ... ({len(lines) - shown} more)" if len(lines) > shown else ""
    return (f"{len(lines)} line{'s' if len(lines) > 1 else ''} skipped, not JSON objects "
            f"(line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines[:shown]))}{more})")
