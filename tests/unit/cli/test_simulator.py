"""The simulator: delays become staleness, runs are deterministic, configs load from TOML."""

import math
import random
from dataclasses import replace

import pytest

from node.config import load_config
from node.learner import LearnerConfig
from cli.config import SimSamplerSpec, SimulatorConfig
from cli.simulate import Simulator
from swarm.delay import DelayConfig, lognormal_params, sample_delay
from swarm.exchange import WeightVersion, plan_fetch
from swarm.memory import MemoryExchange, VirtualClock


def test_lognormal_parameters_match_the_paper():
    mu, sigma = lognormal_params(60, 1920, 0.995)
    assert mu == pytest.approx(5.83, abs=0.01) and sigma == pytest.approx(0.62, abs=0.01)
    rng = random.Random(0)
    draws = [sample_delay(DelayConfig(kind="lognormal"), rng) for _ in range(20_000)]
    inside = sum(60 <= d <= 1920 for d in draws) / len(draws)
    assert inside == pytest.approx(0.995, abs=0.003)
    assert sorted(draws)[10_000] == pytest.approx(math.exp(mu), rel=0.05)
    capped = [sample_delay(DelayConfig(kind="lognormal", max_s=240), rng) for _ in range(1000)]
    assert max(capped) == 240
    w = [sample_delay(DelayConfig(kind="weibull", weibull_shape=2, weibull_scale_s=100), rng) for _ in range(20_000)]
    assert sum(w) / len(w) == pytest.approx(100 * math.gamma(1.5), rel=0.03)
    with pytest.raises(ValueError, match="kind"):
        DelayConfig(kind="pareto")


def version(v: int, base: int | None, chain: str = "c1") -> WeightVersion:
    return WeightVersion("m", chain, v, base, b"")


def test_plan_fetch_deltas_or_keyframe():
    avail = [10, 11, 12]
    assert plan_fetch("c1", avail, "c1", 11) == [12]  # in step: only the newer delta
    assert plan_fetch("c1", avail, "c1", 12) == []
    assert plan_fetch("c1", avail, "c1", 7) == [10, 11, 12]  # missed the base: keyframe and all deltas
    assert plan_fetch("c1", avail, "c0", 11) == [10, 11, 12]  # another chain (learner restarted): same
    assert plan_fetch("c1", [], "c1", 3) == []


def test_memory_exchange_follows_the_papers_delay_model():
    clock = VirtualClock()
    ex = MemoryExchange(clock)
    link = ex.sampler("s", weight_delay=DelayConfig(kind="fixed", fixed_s=100),
                      rollout_delay=DelayConfig(kind="fixed", fixed_s=25))
    loads, have = [], -1
    for t in range(0, 500, 10):
        clock.advance_to(t)
        v = t // 10
        ex.publish_weights(version(v, None if v % 20 == 0 else v - 1))  # a keyframe every 20
        got = link.fetch_weights("c1", have)
        if got:
            loads.append((t, [w.version for w in got]))
            have = got[-1].version
    # every D = 100 s the sampler loads the newest: the deltas since its version, or from a keyframe
    assert loads == [(0, [0]), (100, list(range(1, 11))), (200, [20]),  # 10 < keyframe 20: from the keyframe
                     (300, list(range(21, 31))), (400, [40])]
    link.send_rollouts([("a", b"a"), ("b", b"b")])
    assert ex.receive_rollouts(10) == []
    clock.advance_to(clock.now + 25)
    assert ex.receive_rollouts(1) == [(b"a", None)] and ex.receive_rollouts(10) == [(b"b", None)]


def small(max_delay, steps=6, seed=0, **kw):
    return SimulatorConfig(
        learner=LearnerConfig(groups_per_step=4, eval_every=0, eval_size=40, **kw),
        samplers=(SimSamplerSpec(count=2, weight_delay=DelayConfig(kind="fixed", fixed_s=90)),),
        steps=steps, seconds_per_step=30, max_delay_steps=max_delay, seed=seed)


def test_delay_becomes_staleness_and_online_has_none():
    online = Simulator(small(max_delay=0)).run()
    delayed = Simulator(small(max_delay=None)).run()
    st = lambda h: [r["staleness_mean"] for r in h if r["kind"] == "step"]  # noqa: E731
    assert st(online) == [0.0] * 6
    # fixed 90 s = 3 steps: samplers reload every 3 steps, so staleness cycles 0, 1, 2
    assert st(delayed) == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    assert [r["eval_acc"] for r in online if r["kind"] == "eval"][0] == pytest.approx(
        [r["eval_acc"] for r in delayed if r["kind"] == "eval"][0])


def test_simulator_is_deterministic_under_a_seed():
    a = [(r["version"], r["loss"], r["reward"]) for r in Simulator(small(None, steps=4)).run() if r["kind"] == "step"]
    b = [(r["version"], r["loss"], r["reward"]) for r in Simulator(small(None, steps=4)).run() if r["kind"] == "step"]
    c = [(r["version"], r["loss"], r["reward"]) for r in Simulator(small(None, steps=4, seed=1)).run() if r["kind"] == "step"]
    assert a == b and a != c  # exact: one process runs the same ops in the same order twice


@pytest.mark.parametrize("bound", [dict(max_staleness=1), dict(wait_staleness=1, take_newest=True)])
def test_max_staleness_drops_are_counted_in_metrics(bound):
    h = Simulator(small(None, steps=6, **bound)).run()
    steps = [r for r in h if r["kind"] == "step"]
    assert steps[-1]["drops"].get("stale", 0) > 0
    assert max(r["staleness_mean"] for r in steps) <= 1


def test_toml_config_with_sampler_tables(tmp_path):
    f = tmp_path / "sim.toml"
    f.write_text('steps = 3\nmax_delay_steps = 8\n[learner]\nown_loss = "grpo"\n[sampling]\ngroup_size = 4\n'
                 '[[samplers]]\nname = "a"\ncount = 2\nweight_delay = { kind = "lognormal" }\n'
                 '[[samplers]]\nname = "b"\nmodel = "builtin:tiny-arith-b"\nshare = 0.5\n')
    cfg = load_config(SimulatorConfig, f)
    assert cfg.learner.own_loss == "grpo" and cfg.sampling.group_size == 4
    assert [s.name for s in cfg.samplers] == ["a", "b"] and cfg.samplers[0].weight_delay.kind == "lognormal"
    sim = Simulator(cfg)
    assert [s.peer_id for s, _, _ in sim.samplers] == ["a-0", "a-1", "b"]
    assert sim._shares() == [7, 6, 3]


def test_the_divergence_guard_cuts_the_lr_on_stale_data_and_gives_it_back():
    from node.training.guard import GuardConfig

    # a band so low that a step on 1-2 versions old data is a "runaway" and fresh data is settled
    guard = GuardConfig(kl_high=1e-5, kl_low=1e-5, down=0.5, up=2.0, min_scale=0.25)
    lr = 3e-4  # 10x the default: the tiny model moves far in a step, so stale data is far from it
    h = Simulator(small(None, steps=6, lr=lr, guard=guard)).run()
    steps = [r for r in h if r["kind"] == "step"]
    assert [r["staleness_mean"] for r in steps] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    kls = [r["guard_kl"] for r in steps]
    # fresh data: no divergence (or nothing measured, NaN, where the draws left every group zero-variance); stale: some.
    # "None" is within float32's rounding: the behaviour and training passes may take different kernels (seen:
    # -2e-8 on one CPU, 0.0 on another), so within a tenth of the band, which the stale steps are well above
    settled = guard.kl_low / 10
    assert abs(kls[0]) < settled and (abs(kls[3]) < settled or kls[3] != kls[3]) and min(kls[1], kls[2]) > 1e-5
    expect, scale = [], 1.0  # the rule, by hand, from the measured k3
    for kl in kls:
        expect.append(lr * scale)
        if kl == kl:  # a step with nothing to train on (every group zero-variance) measures nothing
            scale = max(scale * 0.5, 0.25) if kl > 1e-5 else min(scale * 2.0, 1.0)
    assert [r["lr"] for r in steps] == pytest.approx(expect, rel=1e-12)
    assert [r["lr"] / lr for r in steps][:4] == [1.0, 1.0, 0.5, 0.25]  # it acted, and came back after fresh data
    on = Simulator(small(0, steps=4, lr=lr, guard=GuardConfig())).run()  # on-policy: never touched
    assert all(r["lr"] == lr and r["guard_lr_scale"] == 1.0 for r in on if r["kind"] == "step")


def test_the_guards_scale_is_saved_with_the_learner():
    sim = Simulator(small(None, steps=2))
    sim.learner.training.lr_scale = 0.125
    state = sim.learner.state_dict()
    other = Simulator(small(None, steps=2))
    other.learner.load_state_dict(state)
    assert other.learner.training.lr_scale == 0.125


def test_an_emulated_engine_error_adds_seeded_gaussian_noise_of_its_std_to_every_logit():
    import torch

    from cli.simulate import add_logit_error
    from node.models import load_model

    ids = torch.arange(2, 34).reshape(2, 16)
    with torch.no_grad():
        clean = load_model("builtin:tiny-arith")(ids).logits.double()
        runs = []
        for seed in (7, 7, 8):
            noisy = load_model("builtin:tiny-arith")
            add_logit_error(noisy, 0.3, seed)
            runs.append(noisy(ids).logits.double() - clean)
    e = runs[0].flatten()
    # the sample's std within 5 of its standard errors (sd(s) ~ sigma / sqrt(2n)) of 0.3, mean ~0
    assert abs(float(e.std()) - 0.3) < 5 * 0.3 / math.sqrt(2 * e.numel())
    assert abs(float(e.mean())) < 5 * 0.3 / math.sqrt(e.numel())
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])  # its seed, no one else's
    with pytest.raises(ValueError, match="logit_error"):
        SimSamplerSpec(logit_error=-0.1)


def test_the_learner_audits_an_emulated_engine_with_a_tolerance_derived_from_its_error():
    cfg = replace(small(0, steps=4), samplers=(SimSamplerSpec(count=2, logit_error=0.5),))
    sim = Simulator(cfg)
    lcfg = sim.learner.cfg
    assert lcfg.audit.margin == pytest.approx(3.0) and lcfg.audit.logprob_gap == pytest.approx(1.0)
    assert not lcfg.audit.calibrate
    steps = [r for r in sim.run() if r["kind"] == "step"]  # the simulator stops if it refuses one of its samplers
    audit = steps[-1]["audit"]
    assert audit["audits"] > 0 and audit["failed"] == 0 and steps[-1]["refused_samplers"] == 0
    assert 0.5 < audit["margin_max"] < 3.0  # the emulated error shows in the margins, inside the tolerance
    assert Simulator(small(0, steps=1)).learner.cfg.audit.margin == LearnerConfig().audit.margin


def test_a_group_refused_as_a_duplicate_is_made_again_so_the_learner_steps_every_tick():
    # a peaked model that draws a problem again answers it as before: the learner refuses the
    # group (duplicate_content), and without a replacement it was one group short each tick and
    # trained a version behind from then on
    sim = Simulator(small(0, steps=4))
    sampler = sim.samplers[0][0]
    produce, repeated = sampler.produce, []

    def repeat_once(n=None):
        groups = produce(n)
        if not repeated:  # the first batch's last group is its first again, under a new id
            repeated.append(replace(groups[0], id=groups[0].id[::-1]))
            groups = groups[:-1] + repeated
        return groups

    sampler.produce = repeat_once
    steps = [r for r in sim.run() if r["kind"] == "step"]
    assert steps[-1]["drops"] == {"duplicate_content": 1}
    assert [r["version"] for r in steps] == [1, 2, 3, 4]
    assert [r["staleness_mean"] for r in steps] == [0.0] * 4


def test_a_bf16_linear_in_float32_is_the_exact_product_rounded_once_and_follows_its_loaded_weights():
    import torch

    from cli.simulate import Float32Linear

    torch.manual_seed(0)
    k = 384  # the built-in model's widest input (its MLP's down projection)
    plain = torch.nn.Linear(k, 64).to(torch.bfloat16)
    layer = Float32Linear(plain)
    x = torch.randn(32, k).to(torch.bfloat16)

    def check(w: torch.Tensor, b: torch.Tensor) -> None:
        out = layer(x)
        assert out.dtype == torch.bfloat16
        exact = x.double() @ w.double().T + b.double()
        # float32 sums of k products are off the exact sum by at most k * 2^-24 * sum |x w| (the
        # standard bound gamma_k); one rounding to bf16 adds at most half its step, 2^-8 relative
        err32 = k * 2.0 ** -24 * ((x.double().abs() @ w.double().abs().T) + b.double().abs())
        assert bool(((out.double() - exact).abs() <= 2.0 ** -8 * exact.abs() + err32).all())

    check(plain.weight, plain.bias)
    # new weights loaded in place (as an engine's load_weights does) reach the next product
    new = {"weight": torch.randn(64, k).to(torch.bfloat16), "bias": torch.randn(64).to(torch.bfloat16)}
    layer.load_state_dict(new, strict=True)
    check(new["weight"], new["bias"])
    # and so do parameters replaced whole (a new tensor, its version counter maybe the same)
    layer.weight = torch.nn.Parameter(torch.randn(64, k).to(torch.bfloat16))
    check(layer.weight, new["bias"])


def test_only_a_cpu_samplers_reduced_precision_linears_multiply_in_float32():
    from cli.simulate import Float32Linear

    def swapped(spec: SimSamplerSpec) -> tuple[int, str]:
        sim = Simulator(replace(small(0, steps=1), samplers=(spec,)))
        net = sim.samplers[0][0].engine.model
        return sum(isinstance(m, Float32Linear) for m in net.modules()), sim.sampler_matmul

    assert swapped(SimSamplerSpec(dtype="bfloat16")) == (29, "float32")  # 4 layers of 7, and the head
    assert swapped(SimSamplerSpec(dtype="bfloat16", matmul="native")) == (0, "native")
    assert swapped(SimSamplerSpec(dtype="float32")) == (0, "native")
    with pytest.raises(ValueError, match="matmul"):
        SimSamplerSpec(matmul="fast")
