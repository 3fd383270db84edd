"""The first swarm at real model size: a bootstrap, a learner and samplers, as processes, on a Qwen3
shape with its real 151,936-token vocabulary, for enough versions to see steady state.

    python examples/rehearsal.py                                   # 4 layers of Qwen3-0.6B, 256-token completions, CPU
    python examples/rehearsal.py --layers 28 --versions 6          # the whole 0.6B shape (hours on 2 CPU cores)
    python examples/rehearsal.py --device cuda --layers 0          # on a GPU: bfloat16 learner, vLLM samplers
    python examples/rehearsal.py --shape wide-vocab-tiny --completion-len 64 --versions 3   # minutes (the test)

Every swarm run before this one used the built-in 0.8M-parameter model (versions of a few MB,
steps of a fraction of a second, 99 tokens). This runs the same `hetero-node` commands as the
README's coordinator section (`cli.procs.start_node`: a bootstrap naming the learner, the learner,
`--samplers` samplers, all with their default configs but the model, the task, the step's
size, the lr (1e-6) and a bfloat16 published view, as a GPU learner's) on a model folder written here from `examples.model_shapes` (random weights, never
downloaded). The task: prompts of random digits, and a reward that random weights earn with
variance (`even_share`: the share of a completion's tokens with an even index among the
tokenizer's filler tokens), so that every group has advantages, steps move the weights and every
version differs from the last in nearly every parameter.

Printed per version (from the learner's and samplers' metrics.jsonl, lined up by wall clock):
the learner's step broken down (forward/backward, audits, publish; `other` is waiting for groups
and the step's own bookkeeping), the version's bytes and their ratio to a bfloat16 copy of the
weights, the seconds from the learner's publishing it until each sampler held it whole and
checked, the samplers' generation tokens/s, the staleness of the groups the step trained on, and
every bound that fired since the last version (the fetchers' hedges, stalls, demotions and failed
fetches, the learner's drops and throttles, busy answers); at the end, each role's peak memory
beside what the README's "What fits" arithmetic gives for the same shape, dtype and budget. The
table goes to `--out` (markdown) too. Every process is stopped and reaped at the end and at Ctrl-C.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FILLER = re.compile(r"<t(\d+)>")
HOLD_WAIT_S = 300.0
"""After the last version: how long every sampler may take to report holding it (a generation
batch at size, during which a sampler writes nothing)."""
GIB = 2 ** 30


def even_share(completion: str, answer: str) -> float:
    """The rehearsal's reward: the share of the completion's filler tokens (`<tN>`, the shaped
    tokenizer's, examples/model_shapes.tokenizer) whose N is even. Random weights earn it near 0.5
    with a spread of ~0.5/sqrt(tokens) between completions, so groups have advantages; raising it
    is a direction in the output head, so steps train."""
    found = FILLER.findall(completion)
    return sum(int(n) % 2 == 0 for n in found) / len(found) if found else 0.0


# ---- the swarm ----

def write_model(folder: Path, shape: str, layers: int | None, max_positions: int) -> None:
    import torch

    from examples.model_shapes import save

    if (folder / "config.json").exists():
        return  # a --run-dir used before: the same random weights
    save(shape, str(folder), torch.bfloat16, layers=layers, max_positions=max_positions)


def write_task(base: Path, prompts: int, seed: int) -> list[str]:
    """Prompts of 16 random digits (the shaped tokenizer's first tokens are characters)."""
    rng = random.Random(seed)
    path = base / "prompts.jsonl"
    with open(path, "w") as f:
        for _ in range(prompts):
            f.write(json.dumps({"question": " ".join(str(rng.randrange(10)) for _ in range(16)), "answer": ""}) + "\n")
    return [str(path)]


def toml_config(args: argparse.Namespace, role: str, model: Path, files: list[str]) -> str:
    """The role's config: the defaults, but the model, the task, the step's size, the published
    view and the eval (the learner's greedy eval at its start and end, of 8 prompts: the reward
    means nothing to it)."""
    return "\n".join([
        f'role = "{role}"', 'swarm = "rehearsal"', f'model = "{model}"', f'device = "{args.device}"',
        f'engine = "{args.engine if role == "sampler" else "hf"}"', "status_every_s = 60.0",
        "[task]", 'kind = "dataset"', f"train_files = {json.dumps(files)}", 'prompt_template = "{question}"',
        'chat_template = "off"', 'reward = "examples.rehearsal:even_share"',
        "[sampling]", f"group_size = {args.group_size}", "temperature = 1.0",
        f"max_new_tokens = {args.completion_len}",
        "[learner]", f"groups_per_step = {args.groups_per_step}", "eval_every = 0", "eval_size = 8", f"lr = {args.lr}",
        f"max_tokens_per_microbatch = {args.microbatch_tokens}",
        "[learner.weights]", f'view = "{args.view}"',
        "[sampler]", f"prompts_per_batch = {args.prompts_per_batch}",
        # several samplers and the learner share one GPU here: each vLLM takes a share of it
        "[vllm]", f"max_model_len = {args.completion_len + 64}",
        f"gpu_memory_utilization = {min(0.5, 0.6 / max(1, args.samplers)):.2f}", "",
    ])


class Swarm:
    """The rehearsal's processes and what they wrote."""

    def __init__(self, base: Path, args: argparse.Namespace) -> None:
        self.base, self.args, self.logs = base, args, base / "logs"
        self.nodes: dict = {}
        self.addr = ""

    def start(self, model: Path, files: list[str]) -> None:
        from cli.procs import start_node, wait_for_file
        from swarm.identity import Identity

        for old in ["logs", "bootstrap", "learner", *[f"s{i}" for i in range(64)]]:  # a --run-dir used before
            shutil.rmtree(self.base / old, ignore_errors=True)  # keeps only its model: a fresh swarm
        learner_key = Identity.load_or_create(self.base / "learner" / "identity.key")
        boot = self.base / "bootstrap"
        boot.mkdir(parents=True, exist_ok=True)
        self.nodes["bootstrap"] = start_node("bootstrap", [
            "bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat", "--swarm", "rehearsal",
            "--identity", str(boot / "boot.key"), "--addr-file", str(boot / "boot.addr"),
            "--trusted-learner", learner_key.peer_id], self.logs)
        self.addr = wait_for_file(boot / "boot.addr", 90, self.nodes["bootstrap"]).decode().split()[0]
        for role, names in (("learner", ["learner"]), ("sampler", [f"s{i}" for i in range(self.args.samplers)])):
            conf = self.base / f"{role}.toml"
            conf.write_text(toml_config(self.args, role, model, files))
            for name in names:
                threads = self.args.learner_threads if role == "learner" else self.args.sampler_threads
                self.nodes[name] = start_node(name, [
                    "join", "--config", str(conf), "--initial-peers", self.addr, "--no-nat",
                    "--workdir", str(self.base / name)], self.logs, threads=threads)

    def dead(self) -> list[str]:
        return [f"{n} (exit {p.popen.returncode}; see {p.log_path})" for n, p in self.nodes.items() if p.popen.poll() is not None]

    def stop(self) -> list[int]:
        from cli.procs import stop

        stop(list(self.nodes.values()), grace=60.0)  # a learner's last checkpoint at size takes a while
        return [p.pgid for p in self.nodes.values() if p.group_alive()]


class Tail:
    """New JSON lines of a growing file."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()  # a line still being written
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


# ---- memory: measured beside the README's arithmetic ----

def peak_gib(pids: list[int]) -> float:
    """The summed peak resident memory (VmHWM) of `pids`: the node, its DHT process and p2pd."""
    kb = 0
    for pid in pids:
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        kb += int(fields.get("VmHWM", "0 kB").split()[0])
    return kb / 2 ** 20


# the figures this run measured, now kept where every memory check reads them (node/fit/needs.py)
from node.fit.needs import HEAD_WORKSPACE, KEYFRAME_OF_VIEW as _KEYFRAME, NODE_RUNTIME  # noqa: E402

RUNTIME_GIB = NODE_RUNTIME / GIB
"""A node before any model: Python, torch, its DHT process and p2pd (the bootstrap's peak here)."""
KEYFRAME_OF_VIEW = _KEYFRAME["bfloat16"]
"""A random-weights bfloat16 keyframe's bytes over its view's (311 of 438 MB here)."""


def predicted_gib(role: str, params: int, shape: dict, args: argparse.Namespace) -> tuple[float, str]:
    """The host memory docs/BENCHMARKS.md ("What fits") counts for this run. On the CPU:
    learner: 16 bytes a parameter (float32 weights, gradients, AdamW's two moments) + two views (the
    one published, the audit's last rebuilt) + the keyframe blob it serves + activations (~(12 h + 4 f)
    float32 values a token a layer: the saved inputs of the norms, projections, attention and MLP)
    + the output head's chunks + the runtime; sampler: float32 weights + the keyframe blob it
    serves + its view, or at a keyframe the decode's planes and output in its place (2 views) + its
    KV cache + the runtime. With --device cuda, the weights, gradients, optimizer and activations are
    on the GPU, and the host holds the views, the blob and the runtime."""
    view = {"bfloat16": 2, "float32": 4, "auto": 2 if args.device != "cpu" else 4}[args.view] * params
    blob = KEYFRAME_OF_VIEW * view if view == 2 * params else view
    runtime = RUNTIME_GIB * GIB
    h, f, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    if role == "learner":
        if args.device != "cpu":
            return (runtime + view + blob) / GIB, "host: a rebuilt view + the keyframe blob + runtime"
        tokens = args.groups_per_step * args.group_size * (args.completion_len + 32)
        acts = 4 * tokens * layers * (12 * h + 4 * f) + HEAD_WORKSPACE
        return ((16 * params + 2 * view + blob + acts + runtime) / GIB,
                f"16 B/param + 2 views + keyframe + activations of {tokens} tokens ({acts / GIB:.1f}) + runtime")
    seqs = args.prompts_per_batch * args.group_size
    kv_token = 2 * layers * shape["num_key_value_heads"] * shape["head_dim"] * 4  # float32 K and V on the CPU
    kv = kv_token * seqs * (args.completion_len + 32)
    if args.device != "cpu":
        return (runtime + 2 * view + blob) / GIB, "host: 2 views (at a keyframe) + the keyframe blob + runtime"
    return ((4 * params + 2 * view + blob + kv + runtime) / GIB,
            f"4 B/param + 2 views (at a keyframe) + keyframe + KV of {seqs} x {args.completion_len + 32} tokens + runtime")


# ---- the table ----

class Table:
    """One row per version, from the learner's step records and the samplers' records."""

    def __init__(self, samplers: list[str]) -> None:
        self.samplers = samplers
        self.rows: list[dict] = []
        self.held: dict[str, dict[int, float]] = {s: {} for s in samplers}
        """sampler -> version -> wall time it held the version."""
        self.rates: dict[str, list[float]] = {s: [] for s in samplers}
        self.fired: dict[str, collections.Counter] = {s: collections.Counter() for s in [*samplers, "learner"]}
        """What grew since the last version's row (`_take_fired` empties it), and over the run:"""
        self.fired_total: dict[str, collections.Counter] = {s: collections.Counter() for s in self.fired}
        self._last: dict[str, dict] = {}
        self._prev_step: dict | None = None

    def sampler_records(self, name: str, recs: list[dict]) -> None:
        for r in recs:
            if r["kind"] == "weights":
                self.held[name].setdefault(r["version"], r["held_at"])
            elif r["kind"] == "batch":
                if r["tokens_per_s"]:
                    self.rates[name].append(r["tokens_per_s"])
                counts = {**{f"fetch.{k}": v for k, v in r["fetch"].items() if not k.startswith("bytes")},
                          **{f"send.{k}": v for k, v in r["rollouts"].items() if k not in ("delivered",)}}
                self._fired(name, counts)

    def _fired(self, who: str, counts: dict) -> None:
        """Running counts -> what grew since the last record of `who`."""
        last = self._last.setdefault(who, {})
        for k, v in counts.items():
            if isinstance(v, (int, float)) and v > last.get(k, 0):
                self.fired[who][k] += v - last.get(k, 0)
                self.fired_total[who][k] += v - last.get(k, 0)
            last[k] = v

    def step_records(self, recs: list[dict]) -> None:
        for r in recs:
            if r.get("kind") != "step":
                continue
            prev = self._prev_step or {"train_time_s": 0.0, "audit": {"time_s": 0.0}, "time_s": 0.0}
            total = r["time_s"] - prev["time_s"]
            train = r["train_time_s"] - prev["train_time_s"]
            audit = r["audit"]["time_s"] - prev["audit"]["time_s"]
            publish = r.get("weights_publish_s", 0.0)
            self._fired("learner", {**{f"drop.{k}": v for k, v in r["drops"].items()},
                                    **{f"throttled.{k}": v for k, v in r["throttled"].items()},
                                    **{f"refused.{k}": v for k, v in r.get("streams_refused", {}).items()},
                                    "audit.failed": r["audit"]["failed"], "refused_samplers": r["refused_samplers"]})
            self.rows.append({"version": r["version"], "step_s": total, "train_s": train, "audit_s": audit,
                              "publish_s": publish, "other_s": max(0.0, total - train - audit - publish),
                              "kind": r.get("weights_kind", "-"), "bytes": r.get("weights_bytes", 0),
                              "vs_bf16": r.get("weights_bytes_vs_bf16", 0.0),
                              "published_at": r.get("weights_published_at"), "staleness": r["staleness_mean"],
                              "reward": r["reward"], "fired": self._take_fired()})
            self._prev_step = r

    def _take_fired(self) -> str:
        parts = [f"{who} {k} +{v:g}" for who, c in self.fired.items() for k, v in sorted(c.items())]
        for c in self.fired.values():
            c.clear()
        return "; ".join(parts) or "none"

    def lag(self, row: dict, sampler: str) -> str:
        at = self.held[sampler].get(row["version"])
        if row["published_at"] is None:
            return "not published"
        return f"{at - row['published_at']:.1f}" if at is not None else "-"

    def markdown(self) -> list[str]:
        head = ["version", "step s", "fwd/bwd s", "audit s", "publish s", "other s", "version MB", "vs bf16",
                *[f"held by {s} after s" for s in self.samplers], "staleness", "reward", "bounds fired"]
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            cells = [r["version"], f"{r['step_s']:.1f}", f"{r['train_s']:.1f}", f"{r['audit_s']:.1f}",
                     f"{r['publish_s']:.1f}", f"{r['other_s']:.1f}", f"{r['bytes'] / 1e6:.0f} ({r['kind']})",
                     f"{r['vs_bf16']:.2f}", *[self.lag(r, s) for s in self.samplers], f"{r['staleness']:.1f}",
                     f"{r['reward']:.3f}", r["fired"]]
            out.append("| " + " | ".join(map(str, cells)) + " |")
        return out


# ---- the run ----

def run(args: argparse.Namespace, stop_evt) -> int:
    from examples.bench_soak import tree_pids
    from examples.model_shapes import parameters, shape_of
    from swarm.lifetime import proc_table

    base = (args.run_dir or Path(tempfile.mkdtemp(prefix="rehearsal-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the reward
    shape = shape_of(args.shape, args.layers)
    params = parameters(args.shape, args.layers)
    print(f"rehearsal in {base}: {args.shape} with {shape['num_hidden_layers']} layers, vocabulary "
          f"{shape['vocab_size']:,}, {params / 1e6:.0f}M parameters; {args.samplers} samplers; completions of "
          f"{args.completion_len} tokens; {args.groups_per_step} groups of {args.group_size} a step; on {args.device}",
          flush=True)
    t0 = time.monotonic()
    write_model(base / "model", args.shape, args.layers, args.completion_len + 512)
    print(f"model folder written in {time.monotonic() - t0:.0f} s", flush=True)
    files = write_task(base, 4096, args.seed)
    swarm = Swarm(base, args)
    samplers = [f"s{i}" for i in range(args.samplers)]
    table = Table(samplers)
    tails = {n: Tail(base / n / "metrics.jsonl") for n in ["learner", *samplers]}
    peaks: dict[str, float] = collections.defaultdict(float)
    deadline, printed, rc = time.monotonic() + 60 * args.minutes, 0, 0
    left: list[int] = []
    try:
        swarm.start(base / "model", files)
        print(f"bootstrap at {swarm.addr}; logs in {swarm.logs}", flush=True)
        while time.monotonic() < deadline:
            if stop_evt.wait(args.sample_s):
                print("!! stopped by a signal", flush=True)
                rc = 1
                break
            procs = proc_table()
            for name, node in swarm.nodes.items():
                peaks[name] = max(peaks[name], peak_gib(tree_pids(node.pgid, procs)))
            for s in samplers:
                table.sampler_records(s, tails[s].read())
            table.step_records(tails["learner"].read())
            for line in table.markdown()[2 + printed:]:
                print(line, flush=True)
            printed = len(table.rows)
            if dead := swarm.dead():
                print(f"!! exited: {'; '.join(dead)}", flush=True)
                rc = 1
                break
            if table.rows and table.rows[-1]["version"] >= args.versions:
                last = table.rows[-1]["version"]
                # a sampler writes what it fetched between batches: wait for each to report the last
                until = time.monotonic() + HOLD_WAIT_S
                while time.monotonic() < until and not all(last in table.held[s] for s in samplers):
                    if stop_evt.wait(1.0):  # stopped: the rows so far are the table
                        break
                    for s in samplers:
                        table.sampler_records(s, tails[s].read())
                break
        else:
            print(f"!! {args.minutes:g} min passed at version {table.rows[-1]['version'] if table.rows else 0}", flush=True)
            rc = 1
    finally:
        left = swarm.stop()
        if left:  # said whatever ended the run, an exception included
            print(f"ORPHANED process groups: {left}", flush=True)
    report(args, table, peaks, params, shape, base, time.monotonic() - t0)
    return 1 if left else rc


def report(args: argparse.Namespace, table: Table, peaks: dict, params: int, shape: dict, base: Path,
           seconds: float) -> None:
    lines = [f"Command: `python examples/rehearsal.py {' '.join(sys.argv[1:])}`; {args.shape}, "
             f"{shape['num_hidden_layers']} layers, vocabulary {shape['vocab_size']:,}, {params / 1e6:.0f}M parameters; "
             f"{seconds / 60:.1f} min in all.", "", *table.markdown(), ""]
    rates = {s: r for s, r in table.rates.items() if r}
    if rates:
        lines.append("sampler tokens/s (median of batches): " + ", ".join(
            f"{s} {sorted(r)[len(r) // 2]:.1f}" for s, r in rates.items()))
    steady = table.rows[len(table.rows) // 2:]
    if steady:
        med = lambda k: sorted(r[k] for r in steady)[len(steady) // 2]  # noqa: E731
        lines.append(f"steady state (the last {len(steady)} versions, medians): step {med('step_s'):.1f} s "
                     f"(forward/backward {med('train_s'):.1f}, audits {med('audit_s'):.1f}, publish {med('publish_s'):.1f}), "
                     f"version {med('bytes') / 1e6:.0f} MB, staleness {med('staleness'):.1f}")
    lines += ["", "| role | peak memory (GiB, node + DHT + p2pd) | README arithmetic (GiB) | rule |", "|---|---|---|---|"]
    for name, peak in peaks.items():
        role = "learner" if name == "learner" else "sampler" if name.startswith("s") else None
        want, rule = predicted_gib(role, params, shape, args) if role else (0.0, "-")
        lines.append(f"| {name} | {peak:.2f} | {want:.2f} | {rule} |")
    print("\n" + "\n".join(lines), flush=True)
    out = args.out or base / "rehearsal.md"
    out.write_text("\n".join(lines) + "\n")
    # the same, for a program (tests/integration/swarm/test_rehearsal.py): rows, arrivals, what fired, peaks
    (base / "rehearsal.json").write_text(json.dumps({
        "rows": table.rows, "held": table.held, "fired_total": {k: dict(v) for k, v in table.fired_total.items()},
        "tokens_per_s": rates, "peak_gib": peaks, "params": params}, indent=1))
    print(f"\ntable written to {out}")


def main() -> None:
    from examples.model_shapes import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=4, help="transformer layers (the shape's own: 0)")
    ap.add_argument("--versions", type=int, default=10, help="stop once the learner has published this many")
    ap.add_argument("--minutes", type=float, default=90.0, help="give up (exit 1) after this long")
    ap.add_argument("--samplers", type=int, default=2)
    ap.add_argument("--completion-len", type=int, default=256, help="tokens per completion (random weights never stop early)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompts-per-batch", type=int, default=2, help="groups per sampler batch")
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-6,
                    help="the learner's lr (default 1e-6, a fine-tuning rate for a 0.6B model; the config's 3e-5 "
                         "suits the built-in model and changes ~30%% of a bfloat16 view each step)")
    ap.add_argument("--microbatch-tokens", type=int, default=16384, help="the learner's max_tokens_per_microbatch")
    ap.add_argument("--view", default="bfloat16", choices=["bfloat16", "float32", "auto"],
                    help="the published view (default bfloat16: what a GPU learner publishes; a CPU learner's "
                         "auto is float32, twice the bytes)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (bfloat16 learner compute and samplers)")
    ap.add_argument("--engine", default=None, choices=["hf", "vllm"],
                    help="the samplers' engine (default: vllm with --device cuda, else hf)")
    ap.add_argument("--learner-threads", type=int, default=1, help="torch threads of the learner")
    ap.add_argument("--sampler-threads", type=int, default=1, help="torch threads of each sampler")
    ap.add_argument("--sample-s", type=float, default=5.0, help="how often the records and memory are read")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", type=Path, default=None, help="workdirs, logs, model folder (default: a fresh temp folder)")
    ap.add_argument("--out", type=Path, default=None, help="the table, markdown (default: RUN_DIR/rehearsal.md)")
    args = ap.parse_args()
    args.layers = args.layers or None
    args.engine = args.engine or ("vllm" if args.device.startswith("cuda") else "hf")
    from cli.procs import stop_on_signals

    stop_evt = stop_on_signals()  # Ctrl-C or SIGTERM: every process stopped, the table so far; twice: at once
    sys.exit(run(args, stop_evt))


if __name__ == "__main__":
    main()
