"""The README's "Join a swarm" commands as the page writes them (read from README.md itself, so the
page and the tests cannot drift apart): the commands tests/integration/cli/test_readme_join_run.py
runs, as typed, are there; and `hetero-node peer-id`, which they use, makes a stable key and answers
a mistake in one line.
"""

from __future__ import annotations

import subprocess
import sys

from helpers.readme import BOOT_ADDR, readme_commands


def test_readme_join_section_has_the_commands_this_test_runs():
    cmds = readme_commands()
    kinds = [c.split()[1] for c in cmds]
    assert kinds == ["join", "bootstrap", "join", "leaderboard"], cmds
    assert "--role sampler" in cmds[0] and "--role learner" in cmds[2]
    assert all(BOOT_ADDR.search(c) for c in (cmds[0], cmds[2], cmds[3])), "every peer is given the bootstrap's address"


def test_peer_id_makes_a_stable_key_and_answers_mistakes_in_one_line(tmp_path):
    from swarm.identity import Identity

    run = lambda *a: subprocess.run([sys.executable, "-m", "cli.main", "peer-id", *a], capture_output=True, text=True,
                                    timeout=60, cwd=tmp_path)
    first, again = run("hetero-node-learner"), run("hetero-node-learner")
    assert first.returncode == again.returncode == 0 and first.stdout == again.stdout, (first, again)
    # the key `join --role learner` uses by default, in the same folder
    assert first.stdout.strip() == Identity.load_or_create(tmp_path / "hetero-node-learner" / "identity.key").peer_id
    (tmp_path / "notakey.key").write_bytes(b"not a key")
    (tmp_path / "file").write_text("x")
    for args, what in ((["notakey.key"], "is not an identity key"), (["file/sub"], "is a file, not a folder")):
        out = run(*args)
        assert out.returncode == 2 and what in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
