"""The paths a user names: one line for one that cannot be written, before anything starts; a
workdir (or a bootstrap identity) in use by another process is refused, naming that process; the
kernel's lock dies with its holder, so a killed run leaves none behind."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli.errors import UserError
from cli.main import main
from cli.paths import claim_dir, claim_file

HETERO_NODE = str(Path(sys.executable).parent / "hetero-node")
DEAD_PEER = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"  # the discard port
ROOT = os.geteuid() == 0


def _one_line(code: int, err: str, *matches: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, (code, lines)
    assert lines[0].startswith("error: ") and " fix: " in lines[0], lines
    for m in matches:
        assert m in lines[0], (m, lines[0])
    return lines[0]


def _unwritable(tmp_path: Path) -> dict[str, Path]:
    """Paths no process can write here, root included (root ignores a read-only mode bit)."""
    (tmp_path / "a-file").write_text("")
    paths = {"under a file": tmp_path / "a-file" / "sub", "under /proc": Path("/proc/hetero-node-test/sub")}
    if not ROOT:
        (tmp_path / "read-only").mkdir(mode=0o500)
        paths["read-only folder"] = tmp_path / "read-only" / "sub"
    return paths


# each command's path options; {p} is the unwritable path, {t} a writable folder for the others
PATH_CASES = [
    ("--workdir", ["demo", "--workdir", "{p}"]),
    ("--workdir", ["join", "--role", "sampler", "--initial-peers", DEAD_PEER, "--workdir", "{p}"]),
    ("--metrics", ["local", "--metrics", "{p}/m.jsonl"]),
    ("--tensorboard", ["local", "--tensorboard", "{p}"]),
    ("--metrics", ["simulate", "--metrics", "{p}/m.jsonl"]),
    ("--tensorboard", ["simulate", "--tensorboard", "{p}"]),
    ("--db", ["leaderboard", "--serve", "127.0.0.1:0", "--db", "{p}/l.db"]),
    ("--identity", ["leaderboard", "--serve", "127.0.0.1:0", "--db", "{t}/lb/l.db", "--identity", "{p}/id.key"]),
    ("--url-file", ["leaderboard", "--serve", "127.0.0.1:0", "--db", "{t}/lb/l.db", "--url-file", "{p}/url"]),
    ("--identity", ["bootstrap", "--host", "127.0.0.1", "--port", "0", "--identity", "{p}/b.key"]),
    ("--addr-file", ["bootstrap", "--host", "127.0.0.1", "--port", "0", "--identity", "{t}/b.key",
                     "--addr-file", "{p}/addr"]),
    ("--out", ["plot", "{t}/no-such-run", "--out", "{p}"]),
    ("--out", ["init", "local", "--out", "{p}/local.toml"]),
]


@pytest.mark.parametrize("flag,argv", PATH_CASES, ids=[f"{a[0]} {f}" for f, a in PATH_CASES])
def test_a_path_that_cannot_be_written_is_one_line_before_anything_starts(tmp_path, capsys, caplog, flag, argv):
    for why, path in _unwritable(tmp_path).items():
        writable = tmp_path / "ok"
        code = main([a.format(p=path, t=writable) for a in argv])
        out, err = capsys.readouterr()
        _one_line(code, err, f"cannot write {flag} {path}", f"pass a {flag} path")
        # nothing ran: no banner, no log line (model load, DHT), nothing made in the writable folder
        assert out == "" and caplog.records == [] and not writable.exists(), (why, out, caplog.records)


def test_a_folder_given_for_a_file_is_one_line(tmp_path, capsys):
    _one_line(main(["local", "--metrics", str(tmp_path)]), capsys.readouterr().err, "--metrics", "is a folder")


def test_the_checks_are_one_line_and_exit_2_from_the_installed_command(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = subprocess.run([HETERO_NODE, "demo", "--workdir", str(tmp_path / "a-file" / "run")], capture_output=True,
                         text=True, timeout=120)
    _one_line(out.returncode, out.stderr, f"{tmp_path / 'a-file'} is a file, not a folder")


HOLD = """
import sys, time
from cli.paths import claim_dir, claim_file
held = (claim_file if sys.argv[1] == "file" else claim_dir)(sys.argv[2], sys.argv[3], sys.argv[4])
print("held", flush=True)
time.sleep(300)
"""


@pytest.fixture
def holder():
    """Starts a process that claims a path through cli.paths (as a command would) and keeps it."""
    procs = []

    def start(kind: str, path: Path, flag: str, command: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, kind, str(path), flag, command], stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _cli(*argv: str) -> subprocess.CompletedProcess:
    # a real second process; if the claim let it through, the timeout fails the test instead of a hang
    return subprocess.run([HETERO_NODE, *argv], capture_output=True, text=True, timeout=120)


def test_a_workdir_in_use_is_refused_naming_the_process_that_holds_it(tmp_path, holder):
    work = tmp_path / "run"
    first = holder("dir", work, "--workdir", "demo")
    for argv in (["demo", "--workdir", str(work), "--steps", "1", "--timeout", "5"],
                 ["join", "--role", "sampler", "--initial-peers", DEAD_PEER, "--workdir", str(work)]):
        out = _cli(*argv)
        line = _one_line(out.returncode, out.stderr)
        assert line == (f"error: {work} is in use by hetero-node demo (pid {first.pid}). "
                        f"fix: stop it or pass another --workdir"), line
    assert sorted(p.name for p in work.iterdir()) == [".lock"]  # the second demo started nothing


def test_a_leaderboard_history_and_a_bootstrap_identity_in_use_are_refused(tmp_path, holder):
    db = tmp_path / "board" / "leaderboard.db"
    first = holder("dir", db.parent, "--db", "leaderboard")
    out = _cli("leaderboard", "--serve", "127.0.0.1:0", "--db", str(db))
    _one_line(out.returncode, out.stderr, f"{db.parent} is in use by hetero-node leaderboard (pid {first.pid})",
              "pass another --db")
    key = tmp_path / "bootstrap.key"
    first = holder("file", key, "--identity", "bootstrap")
    out = _cli("bootstrap", "--host", "127.0.0.1", "--port", "0", "--no-nat", "--identity", str(key))
    _one_line(out.returncode, out.stderr, f"{key} is in use by hetero-node bootstrap (pid {first.pid})",
              "pass another --identity")


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, holder):
    work = tmp_path / "run"
    first = holder("dir", work, "--workdir", "join")
    first.send_signal(signal.SIGKILL)  # no cleanup code runs: the kernel alone releases the lock
    first.wait()
    assert (work / ".lock").read_text().startswith(f"{first.pid} ")  # its note is still there, its lock is not
    claim = claim_dir(work, "--workdir", "join")
    assert claim is not None and (work / ".lock").read_text() == f"{os.getpid()} join\n"
    claim.close()


def test_a_process_started_by_the_holder_runs_under_its_claim(tmp_path, holder):
    """`join --nproc-per-node N` holds the workdir and starts torchrun, whose rank 0 claims it too."""
    work = tmp_path / "run"
    child = ("import sys; from cli.paths import claim_dir; "
             "print(claim_dir(sys.argv[1], '--workdir', 'join') is None)")
    parent = (f"import subprocess, sys; from cli.paths import claim_dir; held = claim_dir(sys.argv[1], '--workdir', "
              f"'join'); sys.exit(subprocess.run([sys.executable, '-c', {child!r}, sys.argv[1]]).returncode)")
    out = subprocess.run([sys.executable, "-c", parent, str(work)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "True\n", out
    claim_file(tmp_path / "x.key", "--identity", "bootstrap").close()  # and an unheld one is simply taken


@pytest.mark.parametrize("argv", [
    ["bootstrap", "--host", "127.0.0.1", "--port", "0", "--public-ip", "localhost"],
    ["join", "--role", "sampler", "--initial-peers", DEAD_PEER, "--public-ip", "localhost"],
])
def test_public_ip_must_be_an_ip_address(tmp_path, argv):
    out = subprocess.run([HETERO_NODE, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    _one_line(out.returncode, out.stderr, "--public-ip must be an IP address like 203.0.113.7, not 'localhost'")
    assert list(tmp_path.iterdir()) == []  # refused before it made its workdir or identity


@pytest.mark.parametrize("host,public_ip,nat", [
    ("127.0.0.1", None, False), ("localhost", None, False), ("0.0.0.0", None, True),
    ("0.0.0.0", "8.8.8.8", True),  # a real internet join: ask the router to forward the port
    ("0.0.0.0", "192.168.1.20", False), ("0.0.0.0", "10.0.0.5", False), ("0.0.0.0", "169.254.3.4", False),
    ("0.0.0.0", "127.0.0.1", False),
])
def test_nat_port_mapping_is_on_only_for_an_internet_join(host, public_ip, nat):
    from cli.main import _network
    from cli.network import nat_default

    assert nat_default(host, public_ip) is nat  # what bootstrap, and join without a file that says, take
    assert _network(host, 0, public_ip, [], False, not nat, False)["network.nat_port_map"] is (not nat)  # flag wins
    assert "network.nat_port_map" not in {k for k, v in _network(host, 0, public_ip, [], None, None, False).items()
                                          if v is not None}  # no flag: the config file's, or the default


def test_a_lock_kept_by_a_child_that_outlived_its_parent_says_so(tmp_path):
    """A forked child (hivemind's DHT process) shares its parent's lock, and with it the peer id."""
    work = tmp_path / "run"
    code = ("import os, sys, time; from cli.paths import claim_dir\n"
            "held = claim_dir(sys.argv[1], '--workdir', 'join')\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, 1); os.dup2(null, 2); time.sleep(300)\n"
            "print(os.getpid(), child, flush=True)")
    parent = subprocess.run([sys.executable, "-c", code, str(work)], capture_output=True, text=True, timeout=60)
    pid, child = map(int, parent.stdout.split())
    try:
        with pytest.raises(UserError) as e:
            claim_dir(work, "--workdir", "join")
        assert str(e.value) == f"{work} is in use by a process left by hetero-node join (pid {pid}, exited)", e.value
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_released_claim_leaves_no_lock_and_no_folder_it_made(tmp_path):
    """A command refused after its claim (a wrong --model) leaves nothing: tests/unit/cli/test_errors.py."""
    claim = claim_dir(tmp_path / "a" / "b" / "run", "--workdir", "join")
    assert (tmp_path / "a" / "b" / "run" / ".lock").is_file()
    claim.close()
    assert list(tmp_path.iterdir()) == []  # the three folders it made, empty again, are gone
    claim = claim_file(tmp_path / "keys" / "b.key", "--identity", "bootstrap")
    (tmp_path / "keys" / "b.key").write_text("")  # what the command made in the folder stays, with its folder
    del claim  # dropped is released too
    assert [p.name for p in (tmp_path / "keys").iterdir()] == ["b.key"]


def test_a_claim_ended_by_exit_leaves_no_lock(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    code = "import sys; from cli.paths import claim_dir; held = claim_dir(sys.argv[1], '--workdir', 'join'); sys.exit(3)"
    assert subprocess.run([sys.executable, "-c", code, str(work)], timeout=60).returncode == 3
    assert list(work.iterdir()) == []  # the folder was there before: it stays
