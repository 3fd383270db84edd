"""A learner's rewards within a deadline, on any thread: what a peer's text may cost to score.

A learner recomputes every reward of every group it accepts (node/learner/scoring.py), on the thread
that trains, with the task's reward on text a peer wrote. A verifier that hands that text to sympy
has no bound of its own on it: math-verify spent 5.3 s on `\\boxed{9^{9^{9}}}` (its 5 s SIGALRM
timeouts, which exist only on the main thread; off it, none), so 8 such completions held the
training thread 42 s a group, and the pool of unproven keys let in 8 groups a second.

So a task whose reward may cost more than its text's length (`reward_name`: a dataset task's
`math_verify`, or any `package.module:function` a user configures) is scored here, in a worker
process (`python -m node.tasks.bounded`), within `group_budget_s(n)` for a group of n completions:

* the worker arms its own timer (SIGALRM: it runs the reward on its main thread) for the budget,
  and answers "over" when it fires; math-verify runs there without its own timeouts, which would
  reset that timer (its docs: "set the parsing_timeout=None ... you need to handle the timeouting
  yourself");
* the caller waits for the answer no longer than the budget plus `GRACE_S`, then kills the worker
  (a reward stuck in C code that checks no signal, or one that set its own alarm) and starts
  another, whose imports run in it, not in the caller;
* the worker's address space is capped (`WORKER_MEMORY`): (x+1)^{100000} grew one by 520 MB in 3 s;
* before it scores any completion of a group, the worker runs the reward's pre-check
  (`rewards.PRECHECKS`; math-verify's refuses towers of exponents, huge powers and factorials, deep
  nesting, long answers) on all of them: what is known to cost more than the budget is refused in
  microseconds, without the timer or a kill.

A group over its budget, or refused by a pre-check, raises `OverBudget`: the learner drops it
(`reward_budget`, counted, logged with its sampler), never trains on it and credits nothing.

The budget, from what honest answers cost (`python examples/bench_reward_budget.py`: this 2-core CPU,
math-verify 0.9, 625 groups of 8 completions, 5,000 final answers of the forms MATH and GSM8K answers
take: integers, big and negative integers, decimals, 1,000-style integers, \\frac, a/b, sqrt and
\\frac{\\sqrt{}}{} forms, intervals, polynomials, multiples of pi, tuples, sets, \\text choices,
vectors, percents, powers, logs, degrees, answers without a box; each right or wrong, the wrong ones
differing within a group, after a few sentences of working): one completion p50 0.7 ms, p99 31 ms,
p99.9 63 ms, max 86 ms (126 ms in another run); a group of 8 mean 21-23 ms, p99 128 ms, max 187 ms.
`PER_COMPLETION_S` = 0.125 s is twice the p99.9 of one completion for each completion of the group:
1 s for a group of 8, 5x the slowest honest group; at least `MIN_GROUP_S` = 0.5 s, 4x the slowest
single completion seen. Honest scoring is no slower through the worker: the same 1,250 groups took
25.9 s in-process before this change and 25.9 s through it (mean 20.7 ms a group both), none over
the budget; the pre-check costs 0.05 ms a group. A group of 8 x `\\boxed{9^{9^{9}}}` is refused by
the pre-check in < 1 ms; 8 x `\\boxed{(x+1)^{1000}}`, which no pre-check catches, is dropped at
the deadline (1.0 s). What the learner's thread can spend on one group is thus at most its budget +
`GRACE_S`, and, after a kill, the next worker's start (0.3 s here) at the next group.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Callable, Sequence

from node.tasks.rewards import PRECHECKS, load_reward

log = logging.getLogger(__name__)

PER_COMPLETION_S = 0.125
"""A completion's share of its group's scoring budget: twice the p99.9 of honest answers (module
docstring)."""
MIN_GROUP_S = 0.5
"""A group's budget, however small the group: 4x the slowest honest completion seen."""
GRACE_S = 0.2
"""What the caller waits past the budget for the worker's own timer to answer (it answered within
30 ms of its timer in every case measured) before it kills the worker."""
STARTUP_S = 60.0
"""How long a new worker may take to import the reward (0.3 s here; minutes on a loaded machine
would still not be a peer's doing): past it the worker is killed and the scoring fails."""
WORKER_MEMORY = 2 << 30
"""The worker's address space (RLIMIT_AS): past it its reward raises MemoryError, answered "over".
Python, sympy and math-verify take 70 MB of it."""
MAX_REPLY = 1 << 20
"""Bytes of a worker's answer read at most (n floats)."""


class OverBudget(Exception):
    """A group's reward would cost more than `group_budget_s` (refused by a pre-check, or its worker
    ran past the deadline or out of memory): the learner drops the group."""


def group_budget_s(n: int) -> float:
    """The scoring budget of a group of `n` completions, in seconds (the worker's timer)."""
    return max(MIN_GROUP_S, PER_COMPLETION_S * n)


def rewards(task, texts: Sequence[str], answer: str) -> list[float]:
    """`task`'s reward of each of `texts` against `answer`, within the group's budget (OverBudget
    past it). A task with a `reward_name` (a dataset task) is scored in a worker process; one
    without (the built-in arithmetic and chain tasks, whose rewards are one regex match, linear in
    the text, bounded by the record checks' text bounds) in this thread."""
    name = getattr(task, "reward_name", None)
    if name is None:
        return [task.reward(t, answer) for t in texts]
    return worker_for(name).rewards(texts, answer)


_workers: dict[str, RewardWorker] = {}
_workers_lock = threading.Lock()


def worker_for(name: str) -> RewardWorker:
    """The process's one worker for the reward `name` (started at its first group)."""
    with _workers_lock:
        w = _workers.get(name)
        if w is None:
            w = _workers[name] = RewardWorker(name)
        return w


@atexit.register
def close_all() -> None:
    with _workers_lock:
        for w in _workers.values():
            w.close()
        _workers.clear()


class RewardWorker:
    """One worker process computing the reward `name` (a name `load_reward` resolves), restarted
    whenever it had to be killed. Thread-safe: one group at a time."""

    def __init__(self, name: str, budget: Callable[[int], float] = group_budget_s, grace_s: float = GRACE_S) -> None:
        load_reward(name)  # a name that does not resolve fails here, not in the worker
        self.name, self.budget, self.grace_s = name, budget, grace_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._ready = False
        self.kills = 0
        """Workers killed (past their deadline, or found dead) and restarted."""
        self.groups = 0
        """Groups sent to the worker to score."""

    def rewards(self, texts: Sequence[str], answer: str) -> list[float]:
        budget = self.budget(len(texts))
        request = json.dumps({"texts": list(texts), "answer": answer, "budget_s": budget}).encode()
        with self._lock:
            self.groups += 1
            self._await_ready()
            t0 = time.monotonic()
            try:
                self._send.send_bytes(request)
            except OSError:  # it died since its last group (killed from outside): once more, a new one
                self._restart("found dead")
                self._await_ready()
                t0 = time.monotonic()
                self._send.send_bytes(request)
            if not self._recv.poll(budget + self.grace_s):
                self._restart("killed past its deadline")
                raise OverBudget(f"scoring ran past {budget:.2f} s: its worker was killed")
            try:
                reply = json.loads(self._recv.recv_bytes(MAX_REPLY))
            except (EOFError, OSError, ValueError) as e:  # it died while scoring (a crash, the kernel)
                self._restart("died while scoring")
                raise OverBudget(f"its worker died while scoring ({type(e).__name__})") from None
        if "refused" in reply:
            raise OverBudget(f"refused before scoring: {reply['refused']}")
        if "over" in reply:
            raise OverBudget(f"scoring {reply['over']} after {time.monotonic() - t0:.2f} s (budget {budget:.2f} s)")
        if "error" in reply:  # the reward itself raised: as if it had raised here (ingest quarantines it)
            raise RuntimeError(f"reward {self.name} raised: {reply['error']}")
        return [float(r) for r in reply["rewards"]]

    def close(self) -> None:
        with self._lock:
            self._stop()

    # ---- the process -------------------------------------------------------------------------------
    def _start(self) -> None:
        child_r, parent_w = os.pipe()  # (read end, write end)
        parent_r, child_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, self.name, str(child_r), str(child_w)],
                pass_fds=(child_r, child_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
        except BaseException:
            os.close(parent_r)
            os.close(parent_w)
            raise
        finally:
            os.close(child_r)
            os.close(child_w)
        self._send, self._recv = Connection(parent_w, readable=False), Connection(parent_r, writable=False)
        self._ready = False

    def _await_ready(self) -> None:
        if self._proc is None:
            self._start()
        if self._ready:
            return
        if not self._recv.poll(STARTUP_S):
            self._stop()
            raise RuntimeError(f"the reward worker for {self.name} did not start within {STARTUP_S:.0f} s")
        try:
            hello = self._recv.recv_bytes(MAX_REPLY)
        except (EOFError, OSError):
            hello = b""
        if hello != b"ready":
            self._stop()
            raise RuntimeError(f"the reward worker for {self.name} failed to start (see its error above)")
        self._ready = True

    def _restart(self, why: str) -> None:
        """Kill the worker and start the next at once: its imports overlap what the caller does next."""
        self.kills += 1
        log.warning("reward worker (%s) %s; restarting it", self.name, why)
        self._stop()
        self._start()

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        for c in (self._send, self._recv):
            if c is not None:
                c.close()
        self._send = self._recv = None
        self._ready = False


# ---- the worker process ---------------------------------------------------------------------------
class _Deadline(BaseException):
    """Raised by the worker's timer. Not an Exception, so that no reward's `except Exception` (math-
    verify's own, which returns [] on any) swallows it and goes on past the deadline."""


def _on_timer(signum, frame):
    raise _Deadline()


def _serve(name: str, rfd: int, wfd: int) -> None:
    from node.tasks import rewards as rewards_mod

    recv, send = Connection(rfd, writable=False), Connection(wfd, readable=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the learner's to handle
    try:
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    except (ValueError, OSError):
        pass  # a lower hard limit than ours: it stands
    rewards_mod.SIGNAL_TIMEOUTS = False  # this worker's timer governs (math-verify's would reset it)
    fn = load_reward(name)
    precheck = PRECHECKS.get(fn)
    try:  # the reward's lazy imports (math-verify's: sympy) now, not in a group's budget
        fn("0", "0")
    except Exception:
        pass
    signal.signal(signal.SIGALRM, _on_timer)
    send.send_bytes(b"ready")
    while True:
        try:
            req = json.loads(recv.recv_bytes())
        except EOFError:
            return  # the learner closed us or died
        out: dict
        try:
            signal.setitimer(signal.ITIMER_REAL, req["budget_s"])
            try:
                refusals = (f"completion {i}: {why}" for i, t in enumerate(req["texts"])
                            if precheck is not None and (why := precheck(t)))
                refused = next(refusals, None)  # every completion looked at before any is scored
                out = {"refused": refused} if refused else {
                    "rewards": [float(fn(t, req["answer"])) for t in req["texts"]]}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Deadline:
            out = {"over": "ran past its deadline"}
        except (MemoryError, RecursionError) as e:
            out = {"over": f"ran out of {'memory' if isinstance(e, MemoryError) else 'stack'}"}
        except Exception as e:
            out = {"error": f"{type(e).__name__}: {e}"[:500]}
        send.send_bytes(json.dumps(out).encode())


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
