"""Where the repository is, for tests that run its scripts or read its files: a test file's own
path says nothing stable (tests/unit/<layer>/ or tests/integration/<layer>/)."""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
"""tests/helpers/, whose scripts some tests run as processes (fsdp_worker.py, memory_probe.py)."""
ROOT = HELPERS.parents[1]
"""The repository's root: README.md, examples/, the packages."""
