"""cli/errors.py's promise, end to end, for the inputs of issue 59 that once escaped it: a user's
mistake is one line on stderr (`error: ... fix: ...`), exit code 2, and leaves nothing behind: no
file, no lock, no folder it made, no process. Each runs the real CLI (`python -m cli.main`) in an
empty folder, every path it is given under that folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cli.errors import UserError
from helpers.external import cannot
from helpers.wait import PATIENCE_S
from swarm.dht.network import NetworkConfig, listen_maddr

PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"  # a real peer id (sha2-256), nobody's
DEAD_PEER = f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}"


def _left_in(folder: Path) -> tuple[list[str], list[int]]:
    """What is under `folder`, and the processes that run in it (a p2pd inherits its parent's cwd)."""
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    procs = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                procs.append(int(proc.name))
        except OSError:  # gone, or not ours to look at
            pass
    return files, procs


def _start(argv: list[str], cwd: Path, env: dict | None = None, **kw) -> subprocess.Popen:
    """The CLI in a process group of its own, so that all it started can be ended with it (`_end`)."""
    return subprocess.Popen([sys.executable, "-m", "cli.main", *argv], cwd=cwd, env={**os.environ, **(env or {})},
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def _end(proc: subprocess.Popen) -> None:
    """SIGKILL the command and everything it started (a DHT process, p2pd) that is still running."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _refused(tmp_path: Path, *argv: str, env: dict | None = None, timeout: float = 90) -> str:
    """Runs the CLI in the empty folder `tmp_path`; returns its one error line after checking the exit
    code and that nothing was left there."""
    proc = _start(list(argv), tmp_path, env, stdout=subprocess.DEVNULL)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # it was not refused: it runs (a bootstrap would run forever)
        _end(proc)
        raise AssertionError(f"still running after {timeout} s, not refused: {argv}") from None
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert lines[0].startswith("error: ") and " fix: " in lines[0], lines
    assert _left_in(tmp_path) == ([], []), _left_in(tmp_path)
    return lines[0]


@pytest.fixture
def run(tmp_path):
    """The CLI run in an empty folder of its own, its paths ({t}) under it."""
    folder = tmp_path / "cwd"
    folder.mkdir()

    def refused(*argv: str, **kw) -> str:
        return _refused(folder, *[a.format(t=folder) for a in argv], **kw)

    refused.folder = folder
    return refused


# 1: a listen host is an IP address; p2pd takes no name (localhost was a 64-line traceback)

@pytest.mark.parametrize("argv", [
    ["bootstrap", "--host", "localhost", "--port", "0", "--identity", "{t}/b.key"],
    ["join", "--role", "sampler", "--host", "localhost", "--initial-peers", DEAD_PEER, "--workdir", "{t}/w"],
], ids=["bootstrap", "join"])
def test_a_listen_host_that_is_not_an_ip_address_is_one_line(run, argv):
    line = run(*argv)
    assert "listen host 'localhost' is not an IP address" in line and "--host 127.0.0.1" in line, line


def test_a_listen_host_may_be_ipv6():
    assert listen_maddr(NetworkConfig(host="::1").host, 31337) == "/ip6/::1/tcp/31337"
    assert listen_maddr(NetworkConfig(host="0.0.0.0").host, 0) == "/ip4/0.0.0.0/tcp/0"
    assert NetworkConfig().host == "127.0.0.1"  # still settled from the bootstraps when not given


# 2: a file that is not metrics is one line, not a warning a line (/etc/services: 355 lines)

def test_plotting_a_file_that_is_not_metrics_is_one_line(run):
    (run.folder.parent / "services").write_text("".join(f"service{i}  {i}/tcp\n" for i in range(300)))
    line = run("plot", str(run.folder.parent / "services"), "--out", "{t}/plots")
    assert "is not a metrics file" in line and "'version'" in line, line


def test_a_metrics_file_with_a_few_bad_lines_plots_with_one_warning(tmp_path):
    lines = [json.dumps({"kind": "step", "version": v, "reward": v / 8}) for v in range(1, 6)]
    lines[1:1], lines[3:3] = ["not json"], ["[1, 2]"]  # file lines 2 and 4
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, "-m", "cli.main", "plot", str(tmp_path / "m.jsonl"), "--out",
                          str(tmp_path / "plots")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr.splitlines() == [
        f"{tmp_path / 'm.jsonl'}: 2 lines skipped, not JSON objects (lines 2, 4)"], out


# 3: a hub id neither cached nor reachable fails at once (it was 66 s of retries in 84 lines)

@pytest.fixture
def no_hub(tmp_path):
    """An empty Hugging Face cache, and a hub endpoint that refuses: a port bound but not listening."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        yield {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{closed.getsockname()[1]}"}


@pytest.mark.parametrize("argv", [
    ["local", "--model", "Qwen/Qwen3-0.6X"],
    ["simulate", "--model", "Qwen/Qwen3-0.6X"],
    ["join", "--role", "learner", "--model", "Qwen/Qwen3-0.6X", "--initial-peers", DEAD_PEER, "--workdir", "{t}/w"],
], ids=["local", "simulate", "join"])
def test_a_hub_id_not_cached_with_the_hub_unreachable_is_one_line_at_once(run, no_hub, argv):
    line = run(*argv, env=no_hub)  # one line: huggingface_hub's retries (66 s) printed 84 before
    assert ("model 'Qwen/Qwen3-0.6X' is not in the local Hugging Face cache" in line
            and f"the hub ({no_hub['HF_ENDPOINT']}) cannot be reached" in line and "builtin:tiny-arith" in line), line
    assert not Path(no_hub["HF_HOME"]).exists()  # nothing was fetched, nor a cache made


def test_offline_a_hub_id_not_cached_is_one_line_without_asking_the_hub(run, tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://192.0.2.1"}  # TEST-NET
    line = run("local", "--model", "Qwen/Qwen3-0.6X", env=env, timeout=30)
    assert "is not in the local Hugging Face cache" in line and "HF_HUB_OFFLINE is set" in line, line


# 4: --serve takes a bracketed IPv6 host, and blames the port only when the port is to blame

def _ipv6() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        return True
    except OSError:
        return False


def test_the_leaderboard_serves_on_an_ipv6_address_and_cleans_up(tmp_path):
    cannot(None if _ipv6() else "no IPv6 loopback on this machine (::1)")  # skips here, fails in CI
    url_file, db = tmp_path / "url", tmp_path / "board" / "leaderboard.db"
    board = _start(["leaderboard", "--serve", "[::1]:0", "--db", str(db), "--url-file", str(url_file)], tmp_path,
                   stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (url_file.exists() and url_file.read_text().endswith("\n")):
            assert board.poll() is None and time.monotonic() < deadline, board.stderr.read() if board.poll() else "late"
            time.sleep(0.1)
        url = url_file.read_text().strip()
        assert url.startswith("http://[::1]:"), url
        with urllib.request.urlopen(url, timeout=PATIENCE_S) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        board.send_signal(signal.SIGTERM)
        _, err = board.communicate(timeout=60)
    finally:
        _end(board)
    assert board.returncode == 0, err
    assert sorted(p.name for p in db.parent.iterdir()) == ["leaderboard.db"]  # its history stays, its lock goes


@pytest.mark.parametrize("serve,match", [
    ("::1:0", "--serve '::1:0': an IPv6 address needs brackets. fix: e.g. --serve [::1]:0"),
    ("[localhost]:0", "only an IPv6 address goes in brackets"),
    ("nosuchhost.invalid:8080", "'nosuchhost.invalid' does not resolve"),
    ("192.0.2.1:8080", "cannot serve on 192.0.2.1:8080 (Cannot assign requested address). fix: pass an address of "
                       "this machine"),
])
def test_a_serve_address_that_cannot_be_served_says_why(run, serve, match):
    line = run("leaderboard", "--serve", serve, "--db", "{t}/board/leaderboard.db")
    assert match in line and "another port" not in line, line


def test_serve_parses_hosts_and_ports():
    from cli.commands_swarm import _host_port

    assert _host_port("[::1]:0") == ("::1", 0)
    assert _host_port("[::]:8080") == ("::", 8080)
    assert _host_port("localhost:8080") == ("localhost", 8080)  # a name is resolved when bound (IPv4)
    assert _host_port("0.0.0.0:80") == ("0.0.0.0", 80)
    for bad in ("8080", "[::1]", "[::1]:x", "host:70000", ":80"):
        with pytest.raises(UserError):
            _host_port(bad)


# 5: a peer id must be one: base58 of a sha2-256 or identity multihash

@pytest.mark.parametrize("argv,match", [
    (["bootstrap", "--port", "0", "--identity", "{t}/b.key", "--trusted-learner", "Qm-typo"],
     "--trusted-learner: 'Qm-typo' is not a peer id"),
    (["bootstrap", "--port", "0", "--identity", "{t}/b.key", "--trusted-learner", f"{PEER[:-1]}=builtin:tiny-arith"],
     f"'{PEER[:-1]}=builtin:tiny-arith' is not a peer id"),
    (["bootstrap", "--port", "0", "--identity", "{t}/b.key", "--learners-file", "{t}/../learners"],
     "learners: 'Qmabc' is not a peer id"),
    (["leaderboard", "--serve", "127.0.0.1:0", "--db", "{t}/board/l.db", "--trusted-learner", "Qm-typo"],
     "--trusted-learner: 'Qm-typo' is not a peer id"),
    (["join", "--role", "sampler", "--initial-peers", DEAD_PEER, "--follow", "Qm-typo", "--workdir", "{t}/w"],
     "follow: 'Qm-typo' is not a peer id"),
], ids=["trusted-learner", "trusted-learner=model", "learners-file", "leaderboard", "follow"])
def test_a_peer_id_that_is_not_one_is_refused_in_one_line(run, argv, match):
    (run.folder.parent / "learners").write_text(f"{PEER}\nQmabc  # a typo\n")
    line = run(*argv)
    assert match in line and "peer-id" in line, line


# 6: a command refused after it claimed its workdir leaves neither the lock nor the folder it made

@pytest.mark.parametrize("workdir", ["{t}/w", "{t}/a/b/w"])
def test_a_join_refused_after_its_claim_leaves_nothing(run, workdir):
    line = run("join", "--role", "sampler", "--initial-peers", DEAD_PEER, "--model", "./no-such-model",
               "--workdir", workdir)
    assert "model './no-such-model': no such folder" in line, line
