"""The config tree (TOML + flags, types and ranges checked) and the CLI: instant --help, one clear
line for every user mistake, a real local and simulated run."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import LOSSES, app, main
from node.config import ConfigError, load_config
from node.sampling.params import SamplingConfig
from node.learner import LearnerConfig
from node.local import LocalConfig
from node.tasks import ArithmeticConfig, DatasetTaskConfig

DEAD_PEER = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"  # the discard port


def test_toml_then_flags_with_nested_tables(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    f = tmp_path / "run.toml"
    f.write_text('steps = 7\n[learner]\nown_loss = "grpo"\nlr = 1e-5\n[learner.own_options]\neps_high = 0.28\n'
                 '[sampling]\ngroup_size = 4\n[task]\nkind = "arithmetic"\ndigits = 1\nops = ["+"]\n')
    cfg = load_config(LocalConfig, f, {"steps": 3, "learner.lr": None, "sampling.temperature": 0.7})
    assert cfg.steps == 3 and cfg.learner.own_loss == "grpo" and cfg.learner.lr == 1e-5
    assert cfg.learner.own_options == {"eps_high": 0.28}
    assert cfg.sampling == SamplingConfig(group_size=4, temperature=0.7)
    assert cfg.task == ArithmeticConfig(digits=1, ops=("+",))
    f.write_text(f'[task]\nkind = "dataset"\ntrain_files = ["{tmp_path / "a.jsonl"}"]\n')
    assert isinstance(load_config(LocalConfig, f).task, DatasetTaskConfig)


def test_a_renamed_key_still_works_says_its_new_name_and_a_flag_still_wins_over_it(tmp_path, caplog):
    """[learner]'s flat keys moved into tables of their own (`LearnerConfig.RENAMED`): a file that uses an old
    name runs as before, with a warning naming the new key, and the flag that sets the new key wins over it."""
    f = tmp_path / "old.toml"
    f.write_text('[learner]\nstale_loss = "gepo"\naudit_first = 2\naudit_rate_trusted = 0.5\ncheckpoint_every = 7\n'
                 'accept_models = ["m/b"]\nbehaviour_logprobs = "sampler"\n[learner.stale_options]\nbeta = 0.01\n')
    with caplog.at_level("WARNING"):
        cfg = load_config(LocalConfig, f)
    lc = cfg.learner
    assert (lc.own_loss, lc.own_options, lc.audit.first, lc.audit.rate_established) == ("gepo", {"beta": 0.01}, 2, 0.5)
    assert (lc.checkpoint.every, lc.foreign.accept_models, lc.behaviour.source) == (7, ("m/b",), "sampler")
    assert "learner.stale_loss -> learner.own_loss" in caplog.text and "learner.audit_first -> learner.audit.first" in caplog.text
    assert load_config(LocalConfig, f, {"learner.own_loss": "grpo"}).learner.own_loss == "grpo"  # the flag wins


def test_every_command_reads_the_same_blocks_with_one_default_each():
    """`local`, `simulate` and `join` are composed of the same blocks (node/config.py, node/tables.py):
    a field they share is declared once, so its default is the same in each root."""
    import dataclasses

    from cli.config import JoinConfig, SimulatorConfig
    from node.config import ModelBlock, ProcessBlock, RunBlock
    from node.tables import TablesBlock

    roots = (LocalConfig, SimulatorConfig, JoinConfig)
    for block in (ModelBlock, ProcessBlock, TablesBlock):
        assert all(issubclass(root, block) for root in roots), block
    assert issubclass(LocalConfig, RunBlock) and issubclass(SimulatorConfig, RunBlock)
    defaults = {}
    for root in roots:
        for f in dataclasses.fields(root()):
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            defaults.setdefault(f.name, set()).add(repr(value))
    shared = {name: d for name, d in defaults.items() if sum(name in {f.name for f in dataclasses.fields(r)} for r in roots) > 1}
    assert {"model", "device", "dtype", "seed", "threads", "task", "sampling", "learner"} <= set(shared)
    assert all(len(d) == 1 for d in shared.values()), {k: v for k, v in shared.items() if len(v) > 1}


def test_join_keeps_the_config_files_network_settings_unless_a_flag_is_given(tmp_path):
    """Before: the flags' defaults (port 0, no client mode, no relay) always overrode the file's [network]."""
    from cli.config import JoinConfig
    from cli.network import network_overrides

    peer = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    f = tmp_path / "sampler.toml"
    f.write_text("[network]\nport = 4001\nclient_mode = true\nuse_relay = true\nuse_auto_relay = true\nnat_port_map = true\n")
    net = load_config(JoinConfig, f, network_overrides(None, None, None, [peer], None, None, relay=False)).network
    assert (net.port, net.client_mode, net.use_relay, net.use_auto_relay, net.nat_port_map) == (4001, True, True, True, True)
    net = load_config(JoinConfig, f, network_overrides(None, 5005, None, [peer], None, False, relay=False)).network
    assert (net.port, net.nat_port_map, net.client_mode) == (5005, False, True)  # what a flag says wins


@pytest.mark.parametrize("toml,match", [
    ("stepz = 3", r"unknown key\(s\) \['stepz'\]"),
    ('steps = "ten"', "steps must be an int, not 'ten'"),
    ("steps = 2.5", "steps must be an int"),
    ("[learner]\nlr = true", "learner.lr must be a float"),
    ("[learner]\nmodel = 'x'", r"learner: unknown key\(s\) \['model'\]"),  # no shadowed fields
    ("[sampling]\ngroup_size = 1", "group_size must be >= 2"),
    ("[learner]\nown_loss = 'ppo'", "choose one of"),
    ("[learner.own_options]\nclip = 0.1", "valid:"),
    ("[learner]\nstale_loss = 'gepo'\nown_loss = 'grpo'", r"learner.own_loss is set twice: as 'stale_loss' \(its old name\)"),
    ("[task]\nkind = 'chess'", "task.kind must be one of"),
    ("steps = ", "is not valid TOML"),
])
def test_config_errors_name_the_file_the_key_and_the_fix(tmp_path, toml, match):
    f = tmp_path / "bad.toml"
    f.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=match) as e:
        load_config(LocalConfig, f)
    assert str(f) in str(e.value) and e.value.fix


def test_losses_offered_by_the_cli_are_the_registered_ones():
    """cli/options.py keeps the names light (the registry imports torch); every choice list derives from them."""
    import typing

    from cli.options import DROP, ROUTES, Loss, RouteLoss
    from node.algorithms import ALGORITHMS
    from node.learner import DROP as LEARNER_DROP

    assert sorted(LOSSES) == sorted(ALGORITHMS)
    assert DROP == LEARNER_DROP and ROUTES == (*LOSSES, DROP)
    assert typing.get_args(Loss) == LOSSES and typing.get_args(RouteLoss) == ROUTES
    assert LOSSES[0] == LearnerConfig().own_loss  # --help lists the default first


def test_demo_help_names_the_loss_the_demo_trains_its_own_rollouts_with():
    from typer.main import get_command

    from cli.demo import LEARNER_TOML

    assert "own_loss" not in LEARNER_TOML and "stale_loss" not in LEARNER_TOML  # the demo's learner keeps the default
    assert f"({LearnerConfig().own_loss} for its own model's)" in get_command(app).commands["demo"].help


def _cli(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


def _one_line(code: int, err: list[str], match: str) -> None:
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: ") and " fix: " in err[0], err
    assert match in err[0], err


@pytest.fixture
def configs(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / f"c{len(list(tmp_path.glob('c*.toml')))}.toml"
        path.write_text(text)
        return str(path)
    return write


def test_user_mistakes_get_one_line_and_exit_code_2(capsys, tmp_path, configs):
    busy = socket.create_server(("127.0.0.1", 0))
    (tmp_path / "exists.toml").write_text("")
    cases = [
        (["local", "--model", "/nonexistent/model-dir", "--steps", "1"], "no such folder"),
        (["local", "--model", "builtin:tiny-chess"], "no built-in model"),
        (["join", "--role", "trainer"], "'trainer' is not one of 'sampler', 'learner'"),
        (["join", "--role", "sampler", "--initial-peers", "not-a-multiaddr"], "is not a multiaddr"),
        (["join", "--role", "sampler", "--initial-peers", "/ip4/127.0.0.1/tcp/9"], "has no /p2p/<peer id>"),
        (["status", "--initial-peers", "not-a-multiaddr"], "is not a multiaddr"),
        (["join", "--config", configs("steps = [")], "is not valid TOML"),
        (["join", "--config", configs("role = 'sampler'\nmax_stepz = 3")], "unknown key(s) ['max_stepz']"),
        (["local", "--config", configs('steps = "ten"')], "steps must be an int, not 'ten'"),
        (["local", "--algorithm", "foo"], "'foo' is not one of 'gepo_lenclip', 'gepo'"),
        (["local", "--lr", "-1"], "lr > 0"),
        (["local", "--config", configs('[task]\nkind = "dataset"\ntrain_files = ["missing.jsonl"]')],
         "missing.jsonl does not exist"),
        (["local", "--config", str(tmp_path / "nope.toml")], "does not exist"),
        (["simulate", "--max-delay", "-5"], "--max-delay"),
        (["simulate", "--stale-loss", "ppo"], "'ppo' is not one of"),
        (["demo", "--samplers", "0"], "--samplers"),
        (["join", "--role", "sampler", "--engine", "sglang"], "'sglang' is not one of 'hf', 'vllm'"),
        (["join", "--role", "sampler", "--name", "x" * 65], "at most 64"),
        (["join", "--config", configs("swarm = 'x'")], "join needs a role"),
        (["bootstrap", "--port", "70000"], "--port"),
        (["leaderboard", "--serve", "nonsense"], "is not HOST:PORT"),
        (["leaderboard", "--serve", f"127.0.0.1:{busy.getsockname()[1]}", "--db", str(tmp_path / "lb.db")],
         "cannot serve on 127.0.0.1"),
        (["plot", str(tmp_path / "no-run")], "no-run"),
        (["init", "local", "--out", str(tmp_path / "exists.toml")], "already exists"),
    ]
    try:
        for argv, match in cases:
            code, err = _cli(capsys, *argv)
            _one_line(code, err, match)
    finally:
        busy.close()


def test_verbose_shows_the_traceback_too(capsys):
    code, err = _cli(capsys, "local", "--model", "/nonexistent/model-dir", "-v")
    assert code == 2 and any("Traceback" in line for line in err) and err[-1].startswith("error: ")


@pytest.mark.parametrize("argv,match", [
    (["join", "--role", "sampler", "--initial-peers", DEAD_PEER], "could not reach any of the initial peers"),
    (["status", "--initial-peers", DEAD_PEER], "could not reach any of the initial peers"),
])
def test_an_unreachable_bootstrap_peer_is_one_line_from_the_installed_command(tmp_path, argv, match):
    exe = Path(sys.executable).parent / "hetero-node"
    out = subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    err = [line for line in out.stderr.splitlines() if line.strip()]
    _one_line(out.returncode, err, match)


def test_help_is_instant_and_explains_every_option():
    code = "import sys, cli.main; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    from typer.main import get_command

    group = get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            if param.name != "help":
                assert getattr(param, "help", None), f"{name} --{param.name} has no help text"
    out = subprocess.run([sys.executable, "-m", "cli.main", "join", "--help"], capture_output=True, text=True,
                         check=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert "[vllm]" in out.stdout  # rich markup must not eat it
    out = subprocess.run([sys.executable, "-m", "cli.main", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("hetero-node ")


@pytest.mark.parametrize("kind,cls", [("local", "node.local:LocalConfig"), ("simulate", "cli.config:SimulatorConfig"),
                                      ("sampler", "cli.config:JoinConfig"), ("learner", "cli.config:JoinConfig")])
def test_init_writes_example_configs_that_load(tmp_path, capsys, kind, cls):
    import importlib

    out = tmp_path / f"{kind}.toml"
    assert main(["init", kind, "--out", str(out)]) == 0
    module, name = cls.split(":")
    cfg = load_config(getattr(importlib.import_module(module), name), out)
    if kind in ("sampler", "learner"):
        assert cfg.role == kind


def test_local_command_runs_a_short_real_training(tmp_path, capsys):
    metrics = tmp_path / "runs" / "m.jsonl"  # a folder that does not exist yet
    cfg = tmp_path / "c.toml"
    cfg.write_text("[sampling]\ngroup_size = 4\n[learner]\ngroups_per_step = 4\neval_size = 20\neval_every = 2\n")
    assert main(["local", "--config", str(cfg), "--steps", "3", "--metrics", str(metrics),
                 "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "eval accuracy" in capsys.readouterr().out
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["version"] for r in lines if r["kind"] == "step"] == [1, 2, 3]
    assert [r["version"] for r in lines if r["kind"] == "eval"] == [0, 2, 3]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_simulate_command_with_config_and_flags(tmp_path, capsys):
    cfg = tmp_path / "sim.toml"
    cfg.write_text('seconds_per_step = 30\n[learner]\ngroups_per_step = 4\neval_every = 2\neval_size = 20\n'
                   '[sampling]\ngroup_size = 4\n'
                   '[[samplers]]\nname = "a"\ncount = 2\nweight_delay = { kind = "fixed", fixed_s = 60 }\n')
    metrics = tmp_path / "runs" / "m.jsonl"
    assert main(["simulate", "--config", str(cfg), "--steps", "4", "--stale-loss", "grpo", "--metrics", str(metrics)]) == 0
    out = capsys.readouterr().out
    assert "own loss grpo" in out and "eval accuracy" in out
    steps = [json.loads(x) for x in metrics.read_text().splitlines() if '"step"' in x]
    assert [s["version"] for s in steps] == [1, 2, 3, 4]
    assert [s["staleness_mean"] for s in steps] == [0.0, 1.0, 0.0, 1.0]  # reload every 60 s = 2 steps


def test_local_simulate_and_learner_write_the_same_metric_keys(tmp_path):
    from cli.config import SimSamplerSpec, SimulatorConfig
    from cli.simulate import Simulator
    from node.local import run_local

    learner = LearnerConfig(groups_per_step=4, eval_every=2, eval_size=10)
    sampling = SamplingConfig(group_size=4)
    local = run_local(LocalConfig(learner=learner, sampling=sampling, steps=2))
    sim = Simulator(SimulatorConfig(learner=learner, sampling=sampling, steps=2, samplers=(SimSamplerSpec(),))).run()
    for kind in ("step", "eval"):
        a = set().union(*(r.keys() for r in local if r["kind"] == kind))
        b = set().union(*(r.keys() for r in sim if r["kind"] == kind))
        assert {"kind", "version", "time_s"} <= a & b
        if kind == "step":  # what both loops compute has one name in both
            assert {"reward", "loss", "grad_norm", "is_weight_mean", "clip_frac", "groups_skipped_zero_var"} <= a & b
        else:
            assert a == b == {"kind", "version", "time_s", "eval_acc"}


def test_engine_choice_fails_with_advice_not_a_traceback():
    from node.engines import make_engine
    from node.engines.vllm import vllm_available
    from node.models import BUILTIN_MODEL, load_tokenizer

    tok = load_tokenizer(BUILTIN_MODEL)
    with pytest.raises(ConfigError, match="unknown engine"):
        make_engine("sglang", BUILTIN_MODEL, tok)
    if not vllm_available():
        with pytest.raises(ConfigError, match="vLLM is not installed"):
            make_engine("vllm", BUILTIN_MODEL, tok)
    assert make_engine("hf", BUILTIN_MODEL, tok).model_id == BUILTIN_MODEL


def test_help_shows_no_value_type_after_a_flag_and_renders_brackets(capsys, monkeypatch):
    from typer.main import get_command

    monkeypatch.setenv("COLUMNS", "200")
    for name in ["", *get_command(app).commands]:
        assert main([name, "--help"] if name else ["--help"]) == 0
        out = capsys.readouterr().out
        assert "Usage: hetero-node" in out, out
        for odd in ("<bool>", "<list[str]>", "\\["):  # flags take no value; repeated options name their item
            assert odd not in out, f"`hetero-node {name} --help` shows {odd!r}:\n{out}"
        if name == "join":
            assert "[vllm]" in out and "--no-nat " in out and "<multiaddr>" in out, out


@pytest.mark.parametrize("typo,line", [
    ("demoo", "error: no such command 'demoo'. fix: did you mean `hetero-node demo`? "
              "(`hetero-node --help` lists the commands)"),
    ("xyzzy", "error: no such command 'xyzzy'. fix: `hetero-node --help` lists the commands"),
])
def test_an_unknown_command_is_one_line_with_a_suggestion_when_one_is_close(capsys, typo, line):
    code, err = _cli(capsys, typo, "--steps", "3")
    assert (code, err) == (2, [line])


def test_one_line_ends_each_part_once(capsys):
    from cli.errors import UserError, one_line

    assert one_line(UserError("is it a question?", "yes.")) == "error: is it a question? fix: yes."
    assert one_line(UserError("a sentence.\n", "do\n  this")) == "error: a sentence. fix: do this"
    for argv in (["local", "--stepz", "3"], ["join", "--role", "trainer"], ["simulate", "--max-delay", "-5"]):
        code, err = _cli(capsys, *argv)
        _one_line(code, err, "")
        assert "?." not in err[0] and ".." not in err[0] and ". ." not in err[0], err


def _peer(model: str, **kw) -> dict:
    return {"peer_id": "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "name": "alice's sampler on a 4090",
            "role": "sampler", "model_id": model, "engine": "vllm", "version": 1234, "throughput": 12.34,
            "software": "hetero-node/0.1.0", "last_seen_s": 3.0, "expires_in": 27.0, **kw}


def test_status_shows_whole_model_ids_at_120_columns(capsys, monkeypatch):
    from cli.status import print_table

    monkeypatch.setenv("COLUMNS", "120")
    model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B-Instruct"  # 50 characters
    print_table([_peer(model), _peer("Qwen/Qwen2.5-0.5B", role="learner", name="", engine="hf")], "demo")
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("peer"))
    assert all(c in header for c in ("name", "role", "model", "engine", "version", "rollouts/s", "seen")), header
    assert any(model in line for line in lines), "\n".join(lines)  # on one line, not cut
    assert max(len(line) for line in lines) <= 120 and "…" not in "".join(lines).replace("…7DWjhx5N", ""), lines


def test_status_folds_a_model_id_wider_than_the_room_but_never_cuts_it():
    from rich.console import Console

    from cli.status import status_table

    model = "/home/someone/models/checkpoints/run-2024-05-01/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"  # 91
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(status_table([_peer(model)], "demo", 120))
    lines = console.export_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("peer"))
    start = lines[header].index("model")
    stop = lines[header].index("engine")
    folded = "".join(line[start:stop].strip() for line in lines[header + 2:] if line.strip() and "software" not in line)
    assert folded == model and max(len(line) for line in lines) <= 120, "\n".join(lines)


@pytest.mark.parametrize("kind,command,argv,line", [
    ("sampler", "local", [], "error: {f} is a config for `hetero-node join` (it sets role). fix: run hetero-node "
                             "join --config {f}, or hetero-node init local for a local config"),
    ("simulate", "local", [], "error: {f} is a config for `hetero-node simulate` (it sets seconds_per_step). fix: "
                              "run hetero-node simulate --config {f}, or hetero-node init local for a local config"),
    ("local", "join", ["--role", "sampler"], "error: {f} is a config for `hetero-node local` (it sets steps). fix: "
                                             "run hetero-node local --config {f}, or hetero-node init sampler for a "
                                             "join config"),
])
def test_a_config_for_another_command_says_which(tmp_path, capsys, kind, command, argv, line):
    f = tmp_path / f"{kind}.toml"
    assert main(["init", kind, "--out", str(f)]) == 0
    capsys.readouterr()
    code, err = _cli(capsys, command, "--config", str(f), *argv)
    assert (code, err) == (2, [line.format(f=f)])


def test_each_commands_config_kind_names_its_class_where_it_is_defined():
    """node.config recognises a command's own config by the class's __module__: a re-export would not match."""
    import importlib

    from cli.app import CONFIG_KINDS

    for _, ref, _ in CONFIG_KINDS:
        module, name = ref.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert f"{cls.__module__}:{cls.__qualname__}" == ref


def test_a_config_with_a_typo_still_lists_the_unknown_key(tmp_path):
    from node.config import ConfigKind, written_for

    kinds = [ConfigKind("hetero-node join", "cli.config:JoinConfig", "hetero-node init sampler")]
    assert written_for({"role": "sampler", "steps": 3}, LocalConfig, kinds)[1] == "role"
    assert written_for({"stepz": 3}, LocalConfig, kinds) is None  # known to no command: a typo
    assert written_for({"steps": 3}, LocalConfig, kinds) is None  # nothing unknown


@pytest.mark.parametrize("text", ["", "# only comments\n\n"])
def test_an_empty_config_runs_on_defaults_with_a_warning(tmp_path, capsys, caplog, text):
    f = tmp_path / "empty.toml"
    f.write_text(text)
    assert load_config(LocalConfig, f) == LocalConfig()
    assert [r.getMessage() for r in caplog.records] == [f"{f} sets nothing: running on defaults"]
    caplog.clear()
    code, err = _cli(capsys, "local", "--config", str(f), "--model", "/nonexistent/model-dir")  # stops before a run
    _one_line(code, err, "no such folder")
    assert f"{f} sets nothing: running on defaults" in caplog.text
