"""The README's "Join a swarm" commands, read from README.md itself, so the page and the tests that
run them cannot drift apart (tests/unit/cli/test_readme_join.py,
tests/integration/cli/test_readme_join_run.py)."""

from __future__ import annotations

import re

from helpers.repo import ROOT

PUBLIC_IP = "203.0.113.7"
"""The coordinator's public IP in the README (TEST-NET-3); a test runs it on 127.0.0.1."""
BOOT_ADDR = re.compile(r"/ip4/203\.0\.113\.7/tcp/31337/p2p/\w+")
"""The bootstrap's address as the README writes it."""


def readme_commands() -> list[str]:
    """The `hetero-node ...` lines of the README's "Join a swarm" section's code blocks, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Join a swarm\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("hetero-node ")]
