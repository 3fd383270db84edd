"""Reading a JSON-lines file that a running node is appending to (metrics.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """Every whole line of `path` as a record ([] before the file exists). The last line may be
    half written as we read: only lines ended by a newline count (one cut short failed json.loads
    in test_intake_wire once, reading the learner's metrics at version 41)."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().split("\n")[:-1] if x.strip()]
