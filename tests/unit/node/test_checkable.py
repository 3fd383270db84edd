"""Checked claims and bounded influence: checkable sampling, audits, the log-prob gap, the dual clip."""

from __future__ import annotations

from node.learner.config import AuditConfig, BehaviourConfig, ForeignConfig

import json
import math

import pytest
import torch

from helpers.edits import edit_past_margin
from helpers.inmemory import tiny_swarm
from node.algorithms import LossInputs, get_algorithm, has_signal
from node.algorithms.base import clipped_surrogate
from node.audit.refusals import RefusalList
from node.audit.archive import VersionArchive
from node.sampling.race import group_seeds
from node.learner import Learner, LearnerConfig, Route
from swarm.exchange import IntakeConfig
from node.models import BUILTIN_MODEL, load_model
from node.training.batch import logprob_gap
from node.weights.codec import Publisher, PublishConfig, apply_version
from node.weights.blob import encode_version, untie, version_nonce

@pytest.mark.parametrize("views,cache_bytes", [(False, 256 << 20), (True, 256 << 20), (True, 1)],
                         ids=["rebuilt", "published-views-cached", "nothing-fits"])
def test_the_archive_rebuilds_every_published_version_bit_exactly_and_the_nonce_is_content(views, cache_bytes,
                                                                                          monkeypatch):
    model = load_model(BUILTIN_MODEL)
    pub, sent = Publisher(PublishConfig(view="bfloat16", keyframe_every=3), torch.bfloat16), {}
    archive = VersionArchive(window=4, cache_bytes=cache_bytes)
    torch.manual_seed(0)
    base = {k: t.clone() for k, t in untie(model.state_dict())[0].items()}
    archive.put_base(base)
    published = None
    for v in range(9):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        weights, aliases = untie(model.state_dict())
        enc = pub.publish(weights, v)
        blob = encode_version(enc, BUILTIN_MODEL, "c", aliases)
        archive.put("c", v, enc, version_nonce(blob), view=pub.published if views else None)
        published = apply_version(published if enc.base is not None else None, enc)  # what a sampler holds
        sent[v] = {k: t.clone() for k, t in enc.layout.tensors(published).items()}
        assert version_nonce(blob) == version_nonce(encode_version(enc, BUILTIN_MODEL, "c", aliases))
        # the base model stays, exactly, while version 0 is within the window; past it, it is let go
        base_held = archive.weights("", 0)
        if v <= 4:
            assert all(torch.equal(base_held[k], base[k]) for k in base)
        else:
            assert base_held is None and not archive.auditable("", 0)
    if views and cache_bytes > 1:  # every version of the window was cached as published: no decode at all
        import node.audit.margins

        monkeypatch.setattr(node.audit.archive, "apply_version", lambda *a: pytest.fail("decoded a cached version"))
    for v in range(4, 9):  # the window
        rebuilt = archive.weights("c", v)
        assert all(torch.equal(rebuilt[k], sent[v][k]) for k in sent[v]), v
    assert archive.weights("c", 2) is None and archive.weights("other", 8) is None


def test_an_archive_given_a_loader_holds_no_base_copy_and_rebuilds_it_exactly_when_asked():
    model = load_model(BUILTIN_MODEL)
    base = {k: t.clone() for k, t in untie(model.state_dict())[0].items()}
    loads = []
    archive = VersionArchive(window=2)
    archive.put_base(load=lambda: loads.append(1) or untie(load_model(BUILTIN_MODEL).state_dict())[0])
    assert loads == [] and archive.auditable("", 0)  # nothing loaded, nothing held, until an audit asks
    for _ in range(2):
        again = archive.weights("", 0)
        assert all(torch.equal(again[k], base[k]) for k in base)
    assert len(loads) == 2


def test_refusals_survive_a_restart_a_cut_line_and_a_damaged_file(tmp_path):
    path = tmp_path / "refused.jsonl"
    RefusalList(path).add("peerA", "audit failed")
    assert "peerA" in RefusalList(path)
    with open(path, "a") as f:
        f.write('["peerB", "audit fa')  # a kill -9 mid-line
    again = RefusalList(path)
    assert "peerA" in again and "peerB" not in again  # the line lost, nothing else
    again.add("peerC", "x")
    assert list(RefusalList(path).refused) == ["peerA", "peerC"]
    path.write_text("{not json")
    assert "peerA" not in RefusalList(path)  # logged, not fatal


def test_a_refusal_appends_a_line_and_the_list_keeps_the_newest_keys_within_its_bound(tmp_path):
    path = tmp_path / "refused.jsonl"
    refusals = RefusalList(path, max_keys=8)
    for i in range(5):
        refusals.add(f"k{i}", "audit failed")
    assert len(path.read_text().splitlines()) == 5  # appended, not rewritten
    for i in range(5, 40):
        refusals.add(f"k{i}", "audit failed")
        assert len(path.read_text().splitlines()) <= 2 * 8  # rewritten to the 8 kept past twice that
    assert list(refusals.refused) == [f"k{i}" for i in range(32, 40)] == list(RefusalList(path, max_keys=8).refused)
    assert "k0" not in refusals  # forgotten: unproven again, it must pass its audits


def test_an_older_learners_refusal_file_is_carried_over(tmp_path):
    (tmp_path / "refused.json").write_text(json.dumps({"peerA": "audit failed", "peerB": "flips"}, indent=1))
    refusals = RefusalList(tmp_path / "refused.jsonl")
    assert refusals.refused == {"peerA": "audit failed", "peerB": "flips"}
    assert not (tmp_path / "refused.json").exists() and "peerB" in RefusalList(tmp_path / "refused.jsonl")


# ---- bounded influence -----------------------------------------------------------------------------

def test_dual_clip_caps_the_loss_of_negative_advantages_and_break_it_to_see():
    r = torch.tensor([0.5, 1.0, 2.0, 5.0, 100.0])
    loss, _ = clipped_surrogate(r, torch.full((5,), -1.0), 0.2, 0.2, dual_clip=3.0)
    # A = -1: -min(-r, -clip(r)) = max(r, clip(r)) = [0.8, 1, 2, 5, 100], then capped at c|A| = 3
    assert loss.tolist() == pytest.approx([0.8, 1.0, 2.0, 3.0, 3.0])
    plain, _ = clipped_surrogate(r, torch.full((5,), -1.0), 0.2, 0.2, dual_clip=math.inf)
    assert plain[-1].item() == pytest.approx(100.0)  # what an unbounded loss lets one sequence do
    pos, _ = clipped_surrogate(r, torch.ones(5), 0.2, 0.2, dual_clip=3.0)
    assert pos.tolist() == pytest.approx([-0.5, -1.0, -1.2, -1.2, -1.2])  # A > 0: PPO's own clip


def _grad_norm(algo_name: str, claim: float | None, adv: torch.Tensor) -> float:
    """Gradient norm w.r.t. the learner log-probs of one group of 4 x 5 tokens whose claimed
    behaviour log-probs are the truth (None) or `claim` per token."""
    torch.manual_seed(0)
    logp = (torch.rand(4, 5) * -2).requires_grad_()
    old = logp.detach().clone() if claim is None else torch.full((4, 5), claim)
    algo = get_algorithm(algo_name)
    cfg = algo.make_config({"beta": 0.005} if algo_name == "gepo" else {})
    out = algo.loss(LossInputs(logp, old, adv, torch.ones(4, 5, dtype=torch.bool), torch.zeros(4, dtype=torch.long)), cfg)
    out.loss.backward()
    return logp.grad.norm().item()


@pytest.mark.parametrize("algo", ["gepo", "grpo", "dr_grpo", "gspo", "m2po", "ftis", "pg"])
def test_a_group_claiming_minus_30_per_token_moves_the_weights_no_more_than_an_honest_group(algo):
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5])
    honest, forged = _grad_norm(algo, None, adv), _grad_norm(algo, -30.0, adv)
    # F-TIS truncates p/g at C = 2, which an honest generator less likely than the learner reaches too
    bound = get_algorithm("ftis").make_config().cap if algo == "ftis" else 1.0
    assert forged <= honest * bound * 1.0001, (algo, honest, forged)
    forged_high = _grad_norm(algo, -1e-6, adv)  # claiming certainty: ratios tiny instead
    assert forged_high <= honest * 3.0001, (algo, honest, forged_high)


def test_logprob_gap_is_the_mean_absolute_difference_per_sequence():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    old = torch.tensor([[-3.0, -2.5, 0.0], [-1.0, -19.0, -1.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert logprob_gap(logp, old, mask).tolist() == pytest.approx([(2.0 + 0.5) / 2, 18.0 / 3])


# ---- the learner's checks, in process --------------------------------------------------------------

def _pair(task, tmp_path, **kw):
    """The started learner (2 groups a step, checkpoints in tmp_path) and a maker of samplers by
    name (2 prompts a batch), each loading the learner's weights."""
    s = tiny_swarm(tmp_path, **{"groups_per_step": 2, **kw}, samplers=0, task=task, start=True)
    return s.learner, s.add_sampler


def _forge(learner, g, i: int) -> None:
    """Completion `i` of `g` keeps its first token; each later one becomes the token the learner's
    model finds least likely there, claimed with its honest log-prob. The race picks such a token
    with a margin of about the logits' range (4-10 here), far past audit_margin at each position:
    one changed digit (the digits' logits span 1.4-1.7 here) could pass the audit by luck."""
    c = g.completions[i]
    ids = learner.tok(g.prompt, add_special_tokens=False)["input_ids"] + c.token_ids[:1]
    tokens, logprobs = c.token_ids[:1], c.logprobs[:1]
    with torch.no_grad():
        for _ in range(max(len(c.token_ids) - 1, 2)):
            logp = torch.log_softmax(learner.model(torch.tensor([ids])).logits[0, -1].double(), -1)
            t = int(logp.argmin())
            ids, tokens, logprobs = ids + [t], tokens + [t], logprobs + [float(logp[t])]
    c.token_ids, c.logprobs, c.text = tokens, logprobs, learner.tok.decode(tokens, skip_special_tokens=True)


def _trained_groups(learner, recs):
    while learner.ready():
        recs.append(learner.step())


def test_chosen_completions_fail_the_audit_and_cost_the_sampler_its_place_and_credit(task, tmp_path):
    learner, sampler = _pair(task, tmp_path)
    honest, cheat = sampler("honest"), sampler("cheat")
    learner.ingest_many([g.encode() for g in honest.produce(4)])
    good = cheat.produce(2)
    learner.ingest_many([g.encode() for g in good])
    _trained_groups(learner, [])
    assert learner.auditor.stats["failed"] == 0 and learner.auditor.stats["audits"] >= 4
    chosen = cheat.produce(2)
    for g in chosen:  # one real completion copied, and tokens its race would not pick, with honest log-probs
        c0 = g.completions[0]
        for c in g.completions:
            c.token_ids, c.logprobs, c.text = list(c0.token_ids), list(c0.logprobs), c0.text
        _forge(learner, g, 1)
    for g in chosen:
        assert learner.ingest(g.encode()) in (None, "duplicate_content")
    _trained_groups(learner, [])
    assert "cheat" in learner.refusals and learner.auditor.stats["failed"] >= 1
    assert "cheat" not in learner.credit.peers and learner.untrained("cheat") == 0
    assert learner.ingest(cheat.produce(1)[0].encode()) == "refused_sampler"
    again = Learner(learner.cfg, load_model(BUILTIN_MODEL), learner.tok, task, model_id=BUILTIN_MODEL,
                    sampling=learner.sampling, checkpoint_dir=tmp_path)
    assert again.ingest(cheat.produce(1)[0].encode()) == "refused_sampler"  # persisted across restarts


def _edit_past_margin(learner, g, sampler: str, i: int, lo: float, hi: float) -> float:
    """Completion `i` of `g` edited by helpers.edits.edit_past_margin at the version `g` claims."""
    seed = group_seeds(learner.auditor.archive.nonce(g.chain, g.version), g.prompt_id, sampler, len(g.completions))[i]
    margin = edit_past_margin(learner.auditor.model_at((g.chain, g.version)), learner.tok, learner.sampling.params,
                              seed, g.completions[i], g.prompt, lo, hi, learner.cfg.audit.margin,
                              learner.cfg.audit.margin_hard)
    learner.auditor.release()
    return margin


def test_a_token_past_the_margin_is_counted_not_refused_and_a_sampler_that_makes_them_is(task, tmp_path):
    """An honest bfloat16 engine's rounding puts a token past `audit.margin` now and then (3 of 413k
    positions on a trained model), which refused it for good (docs/RESULTS.md, "The cut" item 4):
    one such token is counted by the exceedance test and its group passes. A sampler that puts one
    in every completion is refused by that test and loses its credit; past `margin_hard`, at once."""
    learner, sampler = _pair(task, tmp_path)
    x = sampler("x")
    first = x.produce(2)  # a step's worth (2 groups): a new key's are all audited
    _edit_past_margin(learner, first[0], "x", 0, 1.5, 7.5)
    assert [learner.ingest(g.encode()) for g in first] == [None, None]
    _trained_groups(learner, [])
    st = learner.auditor.stats
    assert "x" not in learner.refusals and st["exceedances"] == 1 and st["failed"] == 0 and st["audits"] == 2
    assert 1.5 < st["margin_max"] <= 7.5  # a passed group's margin: what honest engines are seen to reach
    for g in x.produce(2):  # a token past the margin in every completion
        for i in range(len(g.completions)):
            _edit_past_margin(learner, g, "x", i, 1.5, 7.5)
        assert learner.ingest(g.encode()) is None
    _trained_groups(learner, [])
    assert "tokens past the margin" in learner.refusals.refused["x"], learner.refusals.refused
    assert st["failed"] >= 1 and "x" not in learner.credit.peers
    assert learner.ingest(x.produce(1)[0].encode()) == "refused_sampler"
    y = sampler("y")  # past the hard bound: refused at its first group
    groups = y.produce(2)
    _edit_past_margin(learner, groups[0], "y", 0, learner.cfg.audit.margin_hard, math.inf)
    assert [learner.ingest(g.encode()) for g in groups] == [None, None]
    _trained_groups(learner, [])
    assert "for any honest engine" in learner.refusals.refused["y"], learner.refusals.refused


def test_a_sampler_refused_in_a_step_earns_nothing_for_its_other_groups_of_that_step(task, tmp_path):
    """An unaudited honest group and a failing one from the same sampler in one step: the refusal
    covers both (before, the honest one was kept and credited after the credit had been revoked)."""
    learner, sampler = _pair(task, tmp_path, audit=AuditConfig(first=0, rate=0.5))
    x = sampler("x")
    # two groups with signal (rewards not all equal): how many of 16 have it varies from run to run
    # (the sampling's seeds come from the version's nonce; the fast suite once drew 1), so draw until two
    signal: list = []
    for _ in range(20):
        signal += [g for g in x.produce(16) if has_signal([c.reward for c in g.completions])]
        if len(signal) >= 2:
            break
    good, bad = signal[:2]
    c0 = bad.completions[0]  # chosen completions: another's tokens, and tokens its race would not pick
    bad.completions[1].token_ids, bad.completions[1].logprobs, bad.completions[1].text = list(c0.token_ids), list(c0.logprobs), c0.text
    _forge(learner, bad, 2)
    assert [learner.ingest(g.encode()) for g in (good, bad)] == [None, None]
    draws = iter([0.9, 0.0])  # the learner's audit draws: the good group is not audited, the bad one is

    class Scripted:
        def random(self):
            return next(draws)
    learner.auditor._rng = Scripted()
    rec = learner.step()  # nothing of a sampler refused in this step is trained on:
    assert rec is None, (learner.auditor.stats, dict(learner.books.drops), [(b.chain, b.version) for b in (good, bad)])
    assert "x" in learner.refusals and learner.auditor.stats["failed"] == 1
    assert "x" not in learner.credit.peers and learner.books.accepted_by_sampler["x"] == 0


@pytest.mark.parametrize("source", ["sampler", "auto"])
def test_forged_logprobs_are_dropped_from_the_step_counted_and_not_credited(task, tmp_path, source):
    learner, sampler = _pair(task, tmp_path, audit=AuditConfig(first=0, rate=0.0), behaviour=BehaviourConfig(source=source))
    honest, liar = sampler("honest"), sampler("liar")
    forged = [g for g in liar.produce(12) if has_signal([c.reward for c in g.completions])][:2]  # trained on if honest
    assert len(forged) == 2
    for g in forged:
        for c in g.completions:
            c.logprobs = [-18.0] * len(c.token_ids)
    kept = [g for g in honest.produce(12) if has_signal([c.reward for c in g.completions])][:2]  # so each step trains
    assert len(kept) == 2
    learner.ingest_many([g.encode() for g in forged] + [g.encode() for g in kept])
    recs = []
    _trained_groups(learner, recs)
    assert learner.training.gap_drops["liar"] == 2 and learner.drops["logprob_gap"] == 2 and "honest" not in learner.training.gap_drops
    assert "liar" not in learner.credit.peers
    if source == "sampler":  # the trainer's own check saw the claims...
        assert recs[-1]["routes"]["own"]["logprob_gap_max"] > 12
    else:  # ...or "auto" recomputed the unmeasured liar's groups first, and its check dropped them
        assert recs[-1]["routes"]["own"]["logprob_gap_max"] < 1 and recs[0]["behaviour_recomputed"] >= 2


# ---- issue 26: judged by what can be verified; foreign and unaudited groups within their shares --------

def test_pick_groups_takes_round_robin_within_the_foreign_and_unaudited_shares():
    from node.learner import pick_groups

    entries = [("a", "foreign")] * 5 + [("b", "checked")] * 3 + [("c", "foreign")] * 2 + [("d", "unaudited")] * 3
    # round 1: a0 (foreign 1, a 1), b5, c8 (foreign 2), d10 (unaudited 1); round 2: a1 (foreign 3, a 2), b6,
    # c9 over the foreign total, d11 and d12 over the unaudited total; round 3: a2 over both, b7 -> 7 of 8
    got = pick_groups(entries, 8, {"foreign": 3, "unaudited": 1}, {"foreign": 2})
    assert got == [0, 5, 8, 10, 1, 6, 7], got
    assert pick_groups(entries, 8, {}, {}) == [0, 5, 8, 10, 1, 6, 9, 11], "uncapped: plain round-robin"


def test_a_short_step_keeps_foreign_groups_within_the_share_of_what_it_takes():
    from node.learner.buffer import within_share

    kinds = ["foreign", "checked", "foreign", "foreign", "new"]
    # 2 others: share 0.5 allows f <= 0.5 x 2 / 0.5 = 2 (the first two), 0.25 allows 0.67 -> none
    assert within_share(kinds, 0.5) == [0, 1, 2, 4]
    assert within_share(kinds, 0.25) == [1, 4]
    assert within_share(kinds, 0.75) == [0, 1, 2, 3, 4]  # 0.75 x 2 / 0.25 = 6 >= 3
    assert within_share(kinds, 1.0) == [0, 1, 2, 3, 4]
    assert within_share(["foreign"] * 3, 0.5) == [] and within_share(["foreign"] * 3, 1.0) == [0, 1, 2]
    # a full step of 8 at share 0.25 (pick_groups' cap floor(0.25 x 8) = 2) stays whole: 0.25 x 6 / 0.75 = 2
    assert within_share(["foreign"] * 2 + ["checked"] * 6, 0.25) == list(range(8))


def _relabel(g, **fields):
    for k, v in fields.items():
        setattr(g, k, v)
    return g.encode()


def test_a_made_up_model_in_our_tokenizer_is_checked_as_ours_and_a_named_one_is_foreign(task, tmp_path):
    learner, sampler = _pair(task, tmp_path)
    s = sampler("x")
    g1, g2 = s.produce(2)[:2]
    assert learner.ingest(_relabel(g1, model_id="made-up/model", chain="made-up")) == "unknown_chain"
    assert learner.ingest(_relabel(g2, model_id="made-up/model")) is None
    assert learner.buffer[-1].route is Route.OWN  # audited, gap-checked, staleness: the label proved nothing
    named, _ = _pair(task, tmp_path / "named", foreign=ForeignConfig(accept_models=("made-up/model",)))
    g3, g4, g5 = s.produce(3)[:3]
    # it never ran our chain: claiming it is a lie
    assert named.ingest(_relabel(g3, model_id="made-up/model", chain=named.chain)) == "foreign_version"
    # a partner's chain and version (here `learner`'s, which s follows): its own learner's business, unused here
    assert named.ingest(_relabel(g4, model_id="made-up/model")) is None
    assert named.buffer[-1].route == "foreign" and named.buffer[-1].group.version == 0
    assert named.ingest(_relabel(g5, model_id="made-up/model", chain="", version=0)) is None
    assert named.buffer[-1].route == "foreign"
    g5 = s.produce(1)[0]  # a tokenizer we do not hold is refused for that first, whatever version it claims
    assert learner.ingest(_relabel(g5, model_id="made-up/model", tokenizer="f" * 16)) == "unknown_tokenizer"


def test_foreign_groups_fill_only_their_share_of_a_step_and_earn_no_credit(task, tmp_path):
    learner, sampler = _pair(task, tmp_path, groups_per_step=4, foreign=ForeignConfig(step_share=0.5, per_sampler=1, accept_models=("other/model",)))
    honest, other = sampler("honest"), sampler("other")
    assert learner.ingest_many([g.encode() for g in honest.produce(4)]) == 4
    foreign = [_relabel(g, model_id="other/model", chain="", version=0) for g in other.produce(4)]
    assert learner.ingest_many(foreign) == 4
    # share 0.5 x 4 = 2 foreign, but 1 per sampler: [h0, f0, h1, h2]; then h3 + f1 is not a step
    recs = []
    _trained_groups(learner, recs)
    assert [(r["groups_own"], r["groups_foreign"]) for r in recs] == [(3, 1)], recs
    assert learner.books.accepted_by_sampler["other"] == 1 and "other" not in learner.credit.peers
    assert learner.untrained("other") == 3  # kept, within its quota, for later steps
    assert not learner.ready()  # h3 is checked work: wait for more of it rather than a foreign step
    only = _pair(task, tmp_path / "only", groups_per_step=4, foreign=ForeignConfig(step_share=0.5, per_sampler=1, accept_models=("other/model",)))[0]
    foreign6 = [_relabel(g, model_id="other/model", chain="", version=0) for g in other.produce(6)]
    assert only.ingest_many(foreign6) >= 4
    # only foreign groups wait (a partner's, before our own sampler's first arrive): no step of them alone,
    # whatever fills the unproven budget (a new key gets its fair share of it: swarm/rollouts/admission.py)
    assert not only.ready() and only.step() is None
    assert only.books.drops["foreign_unpaired"] == 0  # 4-6 groups: under the unproven pool's 32, kept
    jammed = _pair(task, tmp_path / "jammed", groups_per_step=4, foreign=ForeignConfig(step_share=0.5, per_sampler=1, accept_models=("other/model",)), intake=IntakeConfig(unproven_quota=4))[0]
    held = jammed.ingest_many(foreign6)
    # the pool (4) full of a partner's groups that no step takes: the oldest step's worth (4) dropped, counted
    assert held >= 4 and not jammed.ready() and jammed.books.drops["foreign_unpaired"] == 4
    assert len(jammed.buffer) == held - 4
    alone = _pair(task, tmp_path / "alone", groups_per_step=4, foreign=ForeignConfig(step_share=1.0, per_sampler=1, accept_models=("other/model",)))[0]
    assert alone.ingest_many(foreign6) >= 4
    recs = []  # share 1: a learner that asked to train on other models' rollouts alone does, in short steps
    _trained_groups(alone, recs)
    assert recs and all((r["groups_own"], r["groups_foreign"]) == (0, 1) for r in recs), recs
    # the same wait, once unproven keys' groups fill their shared budget (4 here: h3 and f1-f3, neither
    # key proven), would stall the swarm: no new sampler could send the checked work waited for
    full, sampler = _pair(task, tmp_path / "full", groups_per_step=4, foreign=ForeignConfig(step_share=0.5, per_sampler=1, accept_models=("other/model",)), intake=IntakeConfig(unproven_quota=4))
    full.ingest_many([g.encode() for g in sampler("honest").produce(4)])
    full.ingest_many([_relabel(g, model_id="other/model", chain="", version=0) for g in sampler("other").produce(4)])
    assert full.ready() and full.step()["groups_foreign"] == 1  # [h0, f0, h1, h2], as above
    assert not full.is_proven("honest") and len(full.buffer) == 4
    assert full.ready()  # a short step of h3 and f1: within the foreign share, and the budget drains


def test_a_full_pool_keeps_foreign_groups_while_steps_are_taken(task, tmp_path):
    learner, sampler = _pair(task, tmp_path, groups_per_step=4, intake=IntakeConfig(unproven_quota=4),
                             foreign=ForeignConfig(step_share=0.25, per_sampler=2, accept_models=("other/model",)))
    learner.ingest_many([g.encode() for g in sampler("honest").produce(1)])
    learner.ingest_many([_relabel(g, model_id="other/model", chain="", version=0) for g in sampler("other").produce(4)])
    # 5 unproven groups fill the pool (4); one own group leaves a quarter share no room (0.25 x 1 / 0.75
    # < 1): a short step of the own group, and the partner's acknowledged groups wait, none dropped
    assert learner.ready() and learner.step()["groups_own"] == 1
    assert learner.books.drops["foreign_unpaired"] == 0 and learner.untrained("other") == 4


def test_what_audits_leave_of_a_step_keeps_foreign_groups_within_their_share(task, tmp_path):
    """A step's own groups can go back to the buffer at their audit (a new key past the audit budget)
    or drop at the recomputation: the foreign ones are then held to the share of what is left."""
    learner, sampler = _pair(task, tmp_path, groups_per_step=4, foreign=ForeignConfig(step_share=0.5, per_sampler=2, accept_models=("other/model",)))
    learner.ingest_many([g.encode() for g in sampler("honest").produce(1)])
    learner.ingest_many([_relabel(g, model_id="other/model", chain="", version=0) for g in sampler("other").produce(2)])
    taken = list(learner.buffer)
    learner.buffer.clear()
    own, f1, f2 = taken
    assert learner._within_share(taken) == [own, f1] and list(learner.buffer) == [f2]  # 1 other: 1 foreign
    learner.buffer.clear()
    assert learner._within_share([f1, f2]) == [] and list(learner.buffer) == [f1, f2]  # none alone


def test_a_new_key_claiming_an_earlier_runs_chain_is_trained_only_within_the_unaudited_share(task, tmp_path):
    learner, sampler = _pair(task, tmp_path, unaudited_per_step=1)
    learner.chains.earlier["earlier-run"] = 5  # as restored from a checkpoint; the chain id is public
    new, honest = sampler("new"), sampler("honest")
    old = [_relabel(g, chain="earlier-run", version=1) for g in new.produce(4)]
    assert learner.ingest_many(old) == 4
    assert learner.ingest_many([g.encode() for g in honest.produce(2)]) == 2
    # groups_per_step 2: [n0, h0], [n1, h1]; then nothing checked waits: a short step [n2] (n3 over the
    # share), so capped groups never stall; n3 alone is less than a step
    recs = []
    _trained_groups(learner, recs)
    assert [r["groups_own"] for r in recs] == [2, 2, 1] and learner.books.accepted_by_sampler["new"] == 3, \
        (recs, learner.books.accepted_by_sampler)
    assert learner.auditor.audits["new"] == 0 and not learner.is_proven("new")  # unauditable is never a passed audit
    assert learner.auditor.stats["unauditable"] == 3 and "new" not in learner.credit.peers
    assert learner.untrained("new") == 1


def test_a_long_record_is_audited_lightly_and_the_bounds_are_checked(task, tmp_path):
    learner, _ = _pair(task, tmp_path, audit=AuditConfig(first=4, rate=0.1, established_after=32, rate_established=0.03))
    rates = []
    for passed in (0, 4, 31, 32, 500):
        learner.auditor.audits["x"] = passed
        rates.append(learner.auditor.rate("x"))
    assert rates == [0.1, 0.1, 0.1, 0.03, 0.03]
    assert learner.auditor.rate("never-seen") == 0.1
    with pytest.raises(ValueError, match="learner.audit: need established_after >= first"):
        LearnerConfig(audit=AuditConfig(first=8, established_after=4))
    with pytest.raises(ValueError, match="rate_established"):
        LearnerConfig(audit=AuditConfig(rate_established=1.5))
    with pytest.raises(ValueError, match="learner.audit: need margin <= margin_hard"):
        AuditConfig(margin=2.0, margin_hard=1.0)
    with pytest.raises(ValueError, match="exceed_rate"):
        AuditConfig(exceed_rate=0.0)
