"""The scripts a lent GPU session runs (examples/gpu_wheels.sh here, examples/gpu_swarm.sh and
examples/gpu_figures.sh there): they parse, the device call fits the device tool's limits, and the
wheels they carry are the versions CI tests. A unit test (fast): nothing is downloaded or run; the
CPU rehearsal of gpu_swarm.sh is in its header and in docs/BENCHMARKS.md ("The first swarm on a GPU")."""

from __future__ import annotations

import re
import subprocess

import pytest

from helpers.repo import ROOT

SCRIPTS = ("gpu_wheels.sh", "gpu_swarm.sh", "gpu_figures.sh")
DEVICE_COMMAND = "bash examples/gpu_swarm.sh"
"""The whole command of the device call that runs the first GPU swarm (it carries `.whl`)."""
COMMAND_LIMIT = 2000
"""The device tool's limit on a command's characters."""
CALL_LIMIT_S = 600
"""The device tool's limit on one command's seconds."""
FILES_BACK = 8
"""At most this many files come back from a device call's $OUT."""


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_parses(name: str) -> None:
    done = subprocess.run(["bash", "-n", str(ROOT / "examples" / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_device_call_fits_the_tool() -> None:
    swarm = (ROOT / "examples" / "gpu_swarm.sh").read_text()
    assert DEVICE_COMMAND in swarm and DEVICE_COMMAND in (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert len(DEVICE_COMMAND) <= COMMAND_LIMIT
    total = int(re.search(r"total=\$\{TOTAL_S:-(\d+)\}", swarm).group(1))
    assert total <= CALL_LIMIT_S - 30, f"gpu_swarm.sh plans {total} s: leave the {CALL_LIMIT_S} s call time to end"
    # what it leaves in $OUT: the files it writes there and the ones it copies in
    written = set(re.findall(r'\$out/([\w.-]+)', swarm))
    copied = {m.rsplit("/", 1)[-1] for m in re.findall(r'cp "([^"]+)" "\$out/"', swarm)}
    assert len(written | copied) <= FILES_BACK, sorted(written | copied)


def wheel_names() -> list[str]:
    """The packages examples/gpu_wheels.sh names (its WHEELS and BUILT lists)."""
    names, array = [], None
    for line in (ROOT / "examples" / "gpu_wheels.sh").read_text().splitlines():
        code = line.split("#", 1)[0].strip()  # comments in a list say why, in words and parentheses
        if array is None and re.match(r"(WHEELS|BUILT)=\(", code):
            array, code = code.split("=", 1)[0], code.split("(", 1)[1]
        if array is not None:
            names += code.rstrip(")").split()
            if code.endswith(")"):
                array = None
    return names


def test_every_carried_wheel_is_a_version_ci_tests() -> None:
    norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()  # noqa: E731
    pinned = {norm(line.split("==")[0]) for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    names = wheel_names()
    assert "hivemind" in names and "msgspec" in names
    assert len({norm(n) for n in names}) == len(names), "one version of each: a name listed twice"
    assert not {norm(n) for n in names} - pinned, "gpu_wheels.sh names packages .ci/constraints.txt does not pin"


def test_the_wheels_folder_is_ignored_in_a_fresh_clone() -> None:
    assert "/.whl/" in (ROOT / ".gitignore").read_text().split()
