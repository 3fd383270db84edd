"""Sampler and learner on the in-memory exchange: versions advance, parameters change, stale and
malformed records are dropped and counted while training goes on, and resume is exact."""

from node.learner.config import AuditConfig, ForeignConfig

import copy

import msgpack
import torch

from helpers.inmemory import tiny_swarm
from node.engines.hf import HFEngine
from node.models import build_char_tokenizer, BUILTIN_MODEL, BUILTIN_MODEL_B, load_tokenizer, tokenizer_hash
from node.sampling.sampler import Sampler


def make_swarm(task, **learner_kw):
    """The learner (4 groups a step, not started) and one sampler, "s0", of 4 prompts a batch."""
    return tiny_swarm(groups_per_step=4, task=task, prompts_per_batch=4, eval_size=50, lr=1e-4, **learner_kw)


def make_pair(task, **learner_kw):
    """(clock, s0's link, learner, s0)"""
    s = make_swarm(task, **learner_kw)
    return s.clock, s.link("s0"), s.learner, s.samplers[0]


def test_versions_advance_parameters_change_and_samplers_follow(task):
    s = make_swarm(task)
    ex, learner, sampler = s.link("s0"), s.learner, s.samplers[0]
    learner.start()
    before = copy.deepcopy(learner.model.state_dict())
    for _ in range(3):
        sampler.run_once(ex)
        learner.ingest_many(s.exchange.receive_rollouts(100))
        rec = learner.step()
        assert rec is not None and rec["version"] == learner.version
    assert learner.version == 3
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    sampler.maybe_update(ex)
    assert sampler.version == 3
    # the sampler holds exactly what the learner published (the float32 view of a CPU learner)
    published = learner.publishing.publisher.layout.tensors(learner.publishing.publisher.published)
    assert all(torch.equal(v, published[k]) for k, v in sampler.engine.model.state_dict().items() if k in published)
    assert sampler.stats["weight_updates"] >= 1 and sampler.chain == learner.chain
    assert learner.books.accepted_by_sampler["s0"] == 12
    hist = [r["staleness_hist"] for r in learner.history if r["kind"] == "step"]
    assert hist == [{"0": 4}] * 3


def test_stale_records_are_dropped_and_counted(task):
    s = make_swarm(task, max_staleness=2)
    ex, learner, sampler = s.link("s0"), s.learner, s.samplers[0]
    learner.start()
    old = [g.encode() for g in sampler.produce(4)]  # version 0, held back
    for _ in range(3):
        sampler.run_once(ex)
        learner.ingest_many(s.exchange.receive_rollouts(100))
        learner.step()
    assert learner.version == 3
    assert all(learner.ingest(r) == "stale" for r in old)
    assert learner.drops["stale"] == 4
    # a group accepted at staleness 2 that ages in the buffer is dropped at batch time too
    fresh = [g.encode() for g in sampler.produce(2)]  # version 3 (sampler followed)
    sampler.maybe_update(ex)
    learner.ingest_many(fresh)
    learner.version += 3  # pretend three more versions were published meanwhile
    assert not learner.ready() and learner.drops["stale"] == 4 + 2


def test_malformed_and_forged_records_are_rejected_and_training_continues(task):
    clock, ex, learner, sampler = make_pair(task)
    learner.start()
    good = sampler.produce(4)
    bad = []
    bad.append(b"garbage")  # undecodable
    g = copy.deepcopy(good[0]); g.version = 99; bad.append(g.encode())  # noqa: E702 future version
    g = copy.deepcopy(good[0]); g.id = "x1"; g.completions[0].token_ids[0] = 10_000; bad.append(g.encode())  # noqa: E702
    g = copy.deepcopy(good[0]); g.id = "x2"; g.completions[0].text = "999"; bad.append(g.encode())  # noqa: E702 text forged
    g = copy.deepcopy(good[0]); g.id = "x3"; g.prompt_id = "arith:1+1000"; bad.append(g.encode())  # noqa: E702
    g = copy.deepcopy(good[0]); g.id = "x4"; g.swarm = "other"; bad.append(g.encode())  # noqa: E702
    g = copy.deepcopy(good[0]); g.id = "x5"; g.sampling["temperature"] = 0.5; bad.append(g.encode())  # noqa: E702
    g = copy.deepcopy(good[0]); g.id = "x6"; g.completions[1].logprobs[0] = 0.5; bad.append(g.encode())  # noqa: E702
    d = msgpack.unpackb(good[1].encode(), raw=False); d["id"] = "x7"; d["completions"][0]["logprobs"] = b"\x00\x00\xc0\x7f" * len(good[1].completions[0].token_ids)  # noqa: E702,E501 NaN
    bad.append(msgpack.packb(d, use_bin_type=True))
    reasons = [learner.ingest(b) for b in bad]
    assert reasons == ["undecodable", "future_version", "token_out_of_vocab", "text_mismatch", "unknown_prompt",
                       "wrong_swarm", "wrong_temperature", "positive_logprob", "nonfinite"]
    assert learner.ingest_many([x.encode() for x in good]) == 4
    assert learner.ingest(good[0].encode()) == "duplicate"
    assert learner.step() is not None and learner.version == 1
    assert sum(learner.drops.values()) == 10


def test_claimed_rewards_are_recomputed_not_trusted(task):
    clock, ex, learner, sampler = make_pair(task)
    g = sampler.produce(1)[0]
    for c in g.completions:
        c.reward = 1.0  # the sampler claims every completion is right
    learner.ingest(g.encode())
    truth = [task.reward(c.text, task.get(g.prompt_id).answer) for c in g.completions]
    assert learner.buffer[-1].group.rewards == truth
    assert learner.books.reward_claim_mismatch == sum(r != 1.0 for r in truth)


def test_foreign_model_routes_to_ftis_and_can_be_dropped(task):
    # a model in our tokenizer is foreign only if named (else checked as ours); its share uncapped here
    named = dict(foreign=ForeignConfig(accept_models=(BUILTIN_MODEL_B,), step_share=1.0, per_sampler=4))
    s = make_swarm(task, **named)
    ex, learner, sampler = s.link("s0"), s.learner, s.samplers[0]
    foreign = s.add_sampler("b0", BUILTIN_MODEL_B)
    foreign_link = s.link("b0")
    learner.start()
    sampler.run_once(ex)
    learner.ingest_many(s.exchange.receive_rollouts(100))
    learner.step()  # publishes version 1 of the learner's model
    foreign.run_once(foreign_link)
    assert foreign.stats["weights_refused"] == 1 and foreign.version == 0  # not its model: keeps its own weights
    for _ in range(2):
        foreign.run_once(foreign_link)
    sampler.run_once(ex)
    learner.ingest_many(s.exchange.receive_rollouts(100))
    while learner.step() is not None:
        pass
    steps = [r for r in learner.history if r["kind"] == "step"]
    assert sum(r["groups_foreign"] for r in steps) == 12 and learner.books.accepted_by_sampler["b0"] == 12
    routes = set().union(*(r.get("routes", {}).keys() for r in steps))
    assert {"own", "foreign"} <= routes
    ftis_steps = [r["routes"]["foreign"] for r in steps if "foreign" in r.get("routes", {})]
    assert all("filtered_frac" in m and "truncated_frac" in m for m in ftis_steps)
    dropper = make_pair(task, foreign_loss="drop", **named)[2]
    assert dropper.ingest(foreign.produce(1)[0].encode()) == "foreign_dropped"
    picky = make_pair(task, foreign=ForeignConfig(accept_models=(BUILTIN_MODEL,)))[2]
    assert picky.ingest(foreign.produce(1)[0].encode()) == "unknown_model"


def load_tokenizer_folder(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_foreign_tokenizer_is_retokenized_and_corrected_at_sequence_level(task, tmp_path):
    other = build_char_tokenizer()  # another vocabulary: the same characters, ids shifted by one
    vocab = {t: (i + 1) % len(other) for t, i in other.get_vocab().items()}
    from tokenizers import models
    other.backend_tokenizer.model = models.WordLevel(vocab, unk_token="<unk>")
    other.save_pretrained(tmp_path / "other")
    other = load_tokenizer_folder(tmp_path / "other")
    assert tokenizer_hash(other) != tokenizer_hash(load_tokenizer(BUILTIN_MODEL))
    clock, ex, learner, sampler = make_pair(task, foreign=ForeignConfig(tokenizers={"other-family/model": str(tmp_path / "other")}))
    g = sampler.produce(2)[0]
    g.model_id, g.tokenizer = "other-family/model", tokenizer_hash(other)
    for j, c in enumerate(g.completions):  # its own token ids for the same text; the last one cut by length
        c.finish_reason = "stop" if j < len(g.completions) - 1 else "length"
        c.token_ids = other(c.text, add_special_tokens=False)["input_ids"] + [other.eos_token_id] * (c.finish_reason == "stop")
        c.logprobs = [-1.0] * len(c.token_ids)
    assert learner.ingest(g.encode()) is None
    b = learner.buffer[-1]
    assert b.route == "foreign_seq" and b.group.behaviour_seq_logp == [-len(c.token_ids) for c in g.completions]
    ours = lambda c: learner.tok(c.text, add_special_tokens=False)["input_ids"]  # noqa: E731
    first, last = b.group.completions[0], b.group.completions[-1]
    # EOS only where the generator stopped: g's log-prob of a cut completion holds none either
    assert first.token_ids == ours(first) + [learner.tok.eos_token_id] and last.token_ids == ours(last)
    g = copy.deepcopy(g)
    c = g.completions[0]
    g.id, c.token_ids, c.logprobs = "g2", other("9")["input_ids"] + c.token_ids, [-1.0] + c.logprobs  # text unchanged
    assert learner.ingest(g.encode()) == "text_mismatch"
    g.model_id = "made-up/model"  # a tokenizer the learner does not hold: its text is unchecked, refused
    assert learner.ingest(g.encode()) == "unknown_tokenizer"


def test_a_foreign_completion_that_re_tokenizes_far_past_the_swarms_length_is_refused(task, tmp_path):
    """Its tokens are within max_new_tokens and its text within 64 characters a token, but in our
    tokenizer, where the learner trains on it, it is 8 tokens for each of its own: refused before
    the ack, as our own too-long completions are, not trained on at 8x a step's length."""
    from node.learner.intake import MAX_RETOKENIZED

    other = build_char_tokenizer()
    other.add_tokens(["0" * 8])  # one token of theirs spells 8 of ours
    other.save_pretrained(tmp_path / "other")
    other = load_tokenizer_folder(tmp_path / "other")
    long_id = len(other) - 1
    assert other.decode([long_id]) == "0" * 8
    clock, ex, learner, sampler = make_pair(task, foreign=ForeignConfig(tokenizers={"other-family/model": str(tmp_path / "other")}))
    most = learner.checks.sampling.max_new_tokens

    def group(gid: str, n: int):
        g = copy.deepcopy(sampler.produce(1)[0])
        g.id, g.model_id, g.tokenizer = gid, "other-family/model", tokenizer_hash(other)
        for c in g.completions:
            c.token_ids, c.text, c.logprobs, c.finish_reason = [long_id] * n, "0" * 8 * n, [-1.0] * n, "length"
        return g

    fits = MAX_RETOKENIZED * most // 8  # within the bound in our tokens
    assert learner.ingest(group("fits", fits).encode()) is None
    assert len(learner.buffer[-1].group.completions[0].token_ids) == 8 * fits
    assert 8 * most > MAX_RETOKENIZED * most  # the sender's own count is within max_new_tokens; ours is not
    assert learner.ingest(group("long", most).encode()) == "too_long"


def test_resume_from_checkpoint_continues_the_same_versions_and_metrics(task, tmp_path):
    records = []
    clock, ex, learner, sampler = make_pair(task)
    for _ in range(7):
        records.append([g.encode() for g in sampler.produce(4)])

    def run(learner, batches):
        out = []
        for recs in batches:
            learner.ingest_many(recs)
            rec = learner.step()
            out.append((rec["version"], rec["loss"], rec["reward"], rec["is_weight_var"]))
        return out

    straight = run(make_pair(task)[2], records[:6])
    _, _, first, _ = make_pair(task)
    part1 = run(first, records[:3])
    first.ingest_many(records[6][:2])  # accepted but not yet trained on: must survive the restart
    ckpt = first.save_checkpoint(tmp_path)
    _, _, resumed, _ = make_pair(task)
    resumed.load_checkpoint(ckpt)
    assert resumed.version == 3 and len(resumed.buffer) == 2 and resumed.books.accepted_by_sampler == first.books.accepted_by_sampler
    assert resumed.ingest(records[6][0]) == "duplicate"
    resumed.buffer.clear()  # compare the training sequence itself with the straight run
    part2 = run(resumed, records[3:6])
    assert [v for v, *_ in part1 + part2] == [1, 2, 3, 4, 5, 6]
    # the same computations in the same order on the same kernels, in one process: equal to the bit
    # (a checkpoint that rounded a weight or an optimizer moment would not be)
    flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
    assert flat(part1 + part2) == flat(straight)


def test_versions_are_checked_against_the_chains_this_learner_ran(task):
    clock, ex, learner, sampler = make_pair(task)
    learner.chains.earlier = {"old-run": 7}  # an earlier run of this learner reached v7 (from its checkpoints)

    def group(version: int, chain: str):
        g = sampler.produce(1)[0]
        g.version, g.chain = version, chain
        return g.encode()

    assert learner.ingest(group(5, "old-run")) is None  # made at v5 of the earlier run; we resumed at v0
    assert learner.buffer[-1].group.version == 0 and learner.books.version_clamped == 1  # counted as fresh
    assert learner.ingest(group(9, "old-run")) == "future_version"  # the earlier run never got there
    assert learner.ingest(group(5, learner.chain)) == "future_version"  # v5 of *this* chain does not exist yet
    assert learner.ingest(group(10**9, "made-up")) == "unknown_chain"  # a chain we never ran: forged
    assert learner.ingest(group(3, "")) == "future_version"  # no weights loaded means version 0
    assert learner.ingest(group(0, "")) is None
    assert learner.state_dict()["meta"]["chains"] == {"old-run": 7, learner.chain: 0}


def test_groups_of_another_size_or_longer_than_max_new_tokens_are_refused(task):
    clock, ex, learner, sampler = make_pair(task)
    g = sampler.produce(1)[0]
    g.completions = g.completions[:3]
    assert learner.ingest(g.encode()) == "wrong_group_size"
    g = sampler.produce(1)[0]
    c = g.completions[0]  # 8192-token completions would OOM a learner; here 8x max_new_tokens
    c.token_ids, c.logprobs = c.token_ids * 8, c.logprobs * 8
    assert learner.ingest(g.encode()) == "too_long"


def test_a_step_takes_groups_round_robin_so_a_flood_cannot_take_the_step(task):
    s = make_swarm(task)
    learner, sampler = s.learner, s.samplers[0]
    flooder = s.add_sampler("flooder")
    flood = [g for _ in range(5) for g in flooder.produce(4)]
    honest = sampler.produce(2)
    learner.ingest_many([g.encode() for g in flood] + [g.encode() for g in honest])
    assert learner.untrained("flooder") == 20 and learner.untrained("s0") == 2
    learner.step()  # 4 groups: the honest sampler's 2 waiting groups are in it despite arriving last
    assert learner.books.accepted_by_sampler == {"flooder": 2, "s0": 2} and learner.untrained("s0") == 0


def test_a_record_that_breaks_ingest_is_quarantined_and_the_learner_goes_on(task, monkeypatch):
    quarantined = []
    s = make_swarm(task, quarantine=lambda raw, why: quarantined.append(why))
    learner, sampler = s.learner, s.samplers[0]
    good = [g.encode() for g in sampler.produce(4)]
    monkeypatch.setattr(learner.task, "reward", lambda text, answer: 1 / 0)  # a bug an input can trigger
    assert learner.ingest(good[0]) == "quarantined" and "ZeroDivisionError" in quarantined[0]
    monkeypatch.undo()
    assert learner.ingest_many(good[1:]) == 3 and learner.drops["quarantined"] == 1


def test_credit_goes_only_to_groups_trained_on_and_never_twice_for_the_same_content(task):
    clock, ex, learner, sampler = make_pair(task, audit=AuditConfig(first=0, rate=0.0))  # audits would refuse the garbage
    groups = sampler.produce(4)
    flat = groups[0]
    for c in flat.completions:  # random-looking garbage the verifier scores 0: all rewards equal
        c.text, c.token_ids, c.logprobs = "", [learner.tok.eos_token_id], [-0.5]
    learner.ingest_many([g.encode() for g in groups])
    trained = sum(len(set(learner.buffer[i].group.rewards)) > 1 for i in range(4))
    learner.step()
    credited = learner.credit.peers.get("s0", {}).get("groups", 0)
    assert credited == trained and trained < 4  # the zero-variance group was taken, not trained on, not credited
    again = copy.deepcopy(groups[1])
    again.id = "same-content-new-id"
    again.completions = list(reversed(again.completions))  # order does not make it new
    assert learner.ingest(again.encode()) == "duplicate_content"
    assert learner.state_dict()["meta"]["checks"]["seen_content"]


def test_own_groups_made_with_the_learners_weights_in_memory_are_trained_on_not_audited_not_credited(task):
    """`join --role sampler,learner`: the sampler generates with the learner's own model object."""
    _, _, learner, _ = make_pair(task, audit=AuditConfig(first=4))
    learner.start()
    engine = HFEngine(learner.model, learner.tok, BUILTIN_MODEL)  # the same weights, not a copy
    own = Sampler(learner.peer_id, task, engine, tokenizer_hash(learner.tok), sampling=learner.sampling, prompts_per_batch=4)
    before = [p.detach().clone() for p in learner.model.parameters()]
    for _ in range(3):
        engine.version, own.chain = learner.version, learner.chain
        assert all(learner.ingest_own(g) is None for g in own.produce())
        assert learner.step() is not None
    assert learner.version == 3 and learner.books.accepted_by_sampler[learner.peer_id] == 12
    assert learner.auditor.stats["audits"] == 0  # a peer's first 4 groups would all have been audited
    assert learner.credit.peers == {}  # the leaderboard refuses a learner that credits itself
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    assert engine.model is learner.model  # it generated with what it trained


def test_a_nodes_learner_keeps_its_newest_records_and_its_report_the_sessions_first_eval():
    """A soak of 6,338 versions grew a learner that kept every step record (8.6 KiB each) by ~33 MB/h:
    a node keeps the newest KEEP_RECORDS (all are in metrics.jsonl); its exit summary still starts
    from the session's first eval."""
    from cli.roles.report import LearnerReport
    from node.learner.learner import KEEP_RECORDS

    learner = tiny_swarm().learner
    report = LearnerReport(learner)
    learner._emit({"kind": "eval", "version": 0, "eval_acc": 0.125})
    report.line(idle_s=0.0)  # the status line, every status_every_s from the start
    for v in range(KEEP_RECORDS + 10):
        learner._emit({"kind": "step", "version": v, "reward": 0.5})
    learner._emit({"kind": "eval", "version": KEEP_RECORDS + 10, "eval_acc": 0.5})
    assert len(learner.history) == KEEP_RECORDS and learner.history[0]["version"] == 11
    assert "eval 12.5% -> 50.0%" in report.summary()
