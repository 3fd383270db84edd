"""What a peer's text may cost a learner to score (node/tasks/bounded.py): a dataset task's rewards,
math-verify's or a user's `package.module:function`, run in a worker process within the group's
budget, on any thread; a group past it, or refused by the reward's pre-check, is dropped by the
learner as `reward_budget`, counted, never trained on or credited. Honest answers pass the pre-check
and score as they did in-process.

A real learner over the real protocol is not started here (a swarm takes minutes to reach its first
versions on this machine; that is tests/integration/node/test_reward_budget_wire.py): the learner's
`ingest` is driven in-process, as the journal's reader drives it, with the real worker process behind it.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from helpers.honest_answers import KINDS, honest_groups
from helpers.slow_rewards import EVADES, TOWER
from helpers.wait import PATIENCE_S
from node.tasks import DatasetTask, DatasetTaskConfig, math_verify_reward
from node.tasks.bounded import GRACE_S, MIN_GROUP_S, OverBudget, RewardWorker, group_budget_s
from node.tasks.rewards import (MAX_ANSWER_CHARS, MAX_EXPONENT, MAX_FACTORIAL, MAX_NESTING, MAX_POWER_BITS,
                                math_verify_refusal)


# ---- the pre-check: cheap, refuses what costs more than the budget, never an honest answer ------------
def test_honest_answers_pass_the_precheck():
    groups = honest_groups(len(KINDS) * 20)
    refused = [(kind, text, math_verify_refusal(text)) for kind, _, comps in groups for text, _ in comps
               if math_verify_refusal(text)]
    assert refused == []
    for answer in ["2^{2016}", "2^{2^{5}}", "e^{-x^2}", "10^{100}", "3^{100}", "x^{100}", "(x+1)^{10}", "0.5^{10}",
                   "2^{-10}", "10!", "100!", "\\binom{10}{3}", "{10 \\choose 3}", "1,000,000", "\\frac{\\sqrt{3}}{2}",
                   "\\left( \\frac{1}{2}, \\frac{\\sqrt{3}}{2} \\right)", "2 \\cdot 10^{5}", "9^{9}",
                   "\\begin{pmatrix} -\\frac{1}{3} & \\frac{2}{3} \\\\ 1 & 0 \\end{pmatrix}"]:
        assert math_verify_refusal(f"so it is \\boxed{{{answer}}}") is None, answer


@pytest.mark.parametrize("answer,what", [
    ("9^{9^{9}}", "exponent"), ("9^{9 \\cdot 9^{9}}", "exponent"), ("(9)^{(9^9)}", "exponent"), ("9**9**9", "exponent"),
    ("\\left(9\\right)^{\\left(9^{9}\\right)}", "exponent"), ("2^{2^{30}}", "exponent"), ("7^{100000000}", "exponent"),
    ("2^{-10^{9}}", "exponent"), ("\\frac{1}{3}^{10^{8}}", "exponent"), ("e^{10^{10}}", "exponent"),
    ("(10^{100})^{10^{4}}", "power"), ("1000000!", "factorial"), ("(10^{6})!", "factorial"),
    ("\\binom{1000000}{500000}", "binomial"), ("{100000 \\choose 3}", "binomial"),
    ("{" * 20 + "1" + "}" * 20, "nested"), ("(" * 50 + "1" + ")" * 50, "nested"), ("+".join(["x"] * 3000), "characters"),
])
def test_pathological_answers_are_refused_by_the_precheck(answer, what):
    why = math_verify_refusal(f"\\boxed{{{answer}}}")
    assert why is not None and what in why, (answer, why)
    assert math_verify_reward(f"\\boxed{{{answer}}}", "5") == 0.0  # in-process callers (samplers, evals): 0, at once


def test_the_bounds_sit_far_above_honest_answers():
    assert (MAX_ANSWER_CHARS, MAX_NESTING, MAX_EXPONENT, MAX_POWER_BITS, MAX_FACTORIAL) == (1000, 8, 10**4, 1 << 20, 10**4)
    assert math_verify_refusal("\\boxed{" + "1" * MAX_ANSWER_CHARS + "}") is None
    assert math_verify_refusal("\\boxed{" + "{" * MAX_NESTING + "1" + "}" * MAX_NESTING + "}") is None
    assert math_verify_refusal(f"\\boxed{{x^{{{MAX_EXPONENT}}}}}") is None
    assert math_verify_refusal(f"\\boxed{{x^{{{MAX_EXPONENT + 1}}}}}") is not None


@pytest.mark.parametrize("text", [")" * 32000 + "^1" * 16000, "^" * 64000, "{1}^" * 16000, "1" * 64000 + "!",
                                  "1+1^1+" * 10000, "(1+2*3^4-5)" * 6000, "\\binom{" * 9000])
def test_the_precheck_is_bounded_on_any_text(text, monkeypatch):
    """Cheap whatever the text: one pass over it, then at most _MAX_LOOKS powers, factorials and
    binomials looked at, each within _SCAN characters (~5-35 ms on these texts; 0.1 s for 64,000
    carets when every one was looked at). Counted, not timed: a loaded machine times anything."""
    from node.tasks import rewards

    looked, scanned = [], []
    look, after = rewards._look, rewards._operand_after

    def counted_after(text, i, limit=None):
        scanned.append(min(len(text), i + rewards._SCAN if limit is None else limit) - i)
        return after(text, i, limit)
    monkeypatch.setattr(rewards, "_look", lambda t, kind, m: looked.append(kind) or look(t, kind, m))
    monkeypatch.setattr(rewards, "_operand_after", counted_after)
    math_verify_refusal(text)
    assert len(looked) <= rewards._MAX_LOOKS and max(scanned, default=0) <= rewards._SCAN


# ---- the worker: the budget as a hard deadline, on any thread ------------------------------------
@pytest.fixture(scope="module")
def worker():
    # the caller's grace past the budget (GRACE_S, 0.2 s) is the product's; here it is long, so that
    # "the worker's own timer answered" holds on a loaded CPU too, where the reply can take longer
    # than 0.2 s to arrive (the worker must leave sympy, reply, and the caller wake)
    w = RewardWorker("math_verify", grace_s=30.0)
    yield w
    w.close()


def test_the_budget_follows_the_group_size():
    assert group_budget_s(8) == 1.0 and group_budget_s(2) == MIN_GROUP_S == 0.5 and group_budget_s(16) == 2.0


def test_honest_groups_score_in_the_worker_as_in_process():
    # the budget here is long: whether honest groups fit the product's (PER_COMPLETION_S, twice the
    # p99.9 of honest answers measured) is a property of the CPU, measured, not asserted by a fast test
    w = RewardWorker("math_verify", budget=lambda n: PATIENCE_S, grace_s=PATIENCE_S)
    try:
        for kind, gold, comps in honest_groups(len(KINDS) * 2, seed=7):
            texts = [t for t, _ in comps]
            assert w.rewards(texts, gold) == [math_verify_reward(x, gold) for x in texts], (kind, gold)
        assert w.rewards(["\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "\\boxed{3}", "1/2"], "1/2") == [1.0, 1.0, 0.0, 1.0]
        assert w.kills == 0
    finally:
        w.close()


def test_a_pathological_group_is_dropped_within_its_budget_from_any_thread(worker):
    with pytest.raises(OverBudget, match="refused before scoring: completion 0: an exponent"):
        worker.rewards([TOWER] * 8, "42")  # the pre-check, in the worker: no sympy at all
    out: list = []

    def score() -> None:  # off the main thread, where math-verify's own timeouts do not exist
        try:
            worker.rewards(["\\boxed{42}"] * 7 + [EVADES], "42")
        except OverBudget as e:
            out.append(str(e))
    thread = threading.Thread(target=score)
    thread.start()
    thread.join(PATIENCE_S)
    # the worker's own timer ran out ("ran past its deadline", said by the worker at its budget), not
    # the caller's wait; that sympy stopped in time is the worker living on
    assert len(out) == 1 and "ran past its deadline" in out[0], out
    assert worker.kills == 0  # sympy stopped in time: the worker lives on
    assert worker.rewards(["\\boxed{42}", "\\boxed{41}"], "42") == [1.0, 0.0]


@pytest.mark.parametrize("reward", ["sleepy", "stubborn", "alarmist"])
def test_a_custom_reward_is_held_to_the_same_deadline(reward):
    # sleepy's own timer answers (a long grace, as in `worker`); the others are killed at budget + GRACE_S
    w = RewardWorker(f"helpers.slow_rewards:{reward}", grace_s=30.0 if reward == "sleepy" else GRACE_S)
    try:
        assert w.rewards(["7", "8"], "7") == [1.0, 0.0]
        with pytest.raises(OverBudget) as e:
            w.rewards(["7", "slow", "8"], "7")
        # the worker's timer stopped it, or the caller stopped waiting at budget + GRACE_S and killed
        # it (`poll(budget + GRACE_S)`: its wait is bounded by construction, not asserted in seconds)
        assert ("ran past its deadline" if reward == "sleepy" else "its worker was killed") in str(e.value)
        assert w.kills == (0 if reward == "sleepy" else 1)
        assert w.rewards(["7", "8"], "7") == [1.0, 0.0]  # restarted (its imports not in the budget)
    finally:
        w.close()


def test_a_reward_past_the_workers_memory_is_over_budget():
    w = RewardWorker("helpers.slow_rewards:hungry")
    try:
        with pytest.raises(OverBudget, match="memory"):
            w.rewards(["1", "big"], "1")
        assert w.rewards(["1"], "1") == [1.0] and w.kills == 0
    finally:
        w.close()


def test_a_reward_that_raises_is_an_error_not_a_budget_drop():
    w = RewardWorker("node.tasks.rewards:exact_int_match")
    try:
        with pytest.raises(RuntimeError, match="raised"):
            w.rewards([None], "1")  # an int match of None: TypeError in the reward (ingest quarantines it)
        assert w.rewards(["1"], "1") == [1.0]
    finally:
        w.close()


# ---- the learner: a group over its budget is a drop with its reason, counted, never credited --------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("qa") / "qa.jsonl"
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(10) for b in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def _learner(task):
    from node.sampling.params import SamplingConfig
    from node.learner import Learner, LearnerConfig
    from node.models import BUILTIN_MODEL, load_model, load_tokenizer

    from node.learner.scoring_time import ScoringTime

    tok = load_tokenizer(BUILTIN_MODEL)
    sampling = SamplingConfig(group_size=8, max_new_tokens=32)  # room for \boxed{...} in the char tokenizer
    learner = Learner(LearnerConfig(groups_per_step=4, eval_every=0, eval_size=4), load_model(BUILTIN_MODEL), tok, task,
                      model_id=BUILTIN_MODEL, sampling=sampling, swarm="s")
    # scoring time is charged in real seconds, the worker's start among them (seconds on a loaded
    # CPU): out of the way here; the tests of it set their own, on a frozen clock
    learner.scoring_time = ScoringTime(burst_s=1e9)
    return learner


def _group(learner, texts: list[str], sampler: str = "attacker") -> bytes:
    """A group that passes every check before the ack: a known prompt, tokens that spell the text."""
    from node.models import tokenizer_hash
    from swarm.wire.rollout import CompletionRecord, RolloutGroup

    p = learner.task.split("train")[0]
    comps = []
    for text in texts:
        ids = learner.tok(text, add_special_tokens=False)["input_ids"]
        comps.append(CompletionRecord(text, ids, [-1.0] * len(ids), "length", 0.0))
    g = RolloutGroup(id=uuid.uuid4().hex, swarm="s", task=learner.task.name, prompt_id=p.id, prompt=p.prompt,
                     model_id=learner.model_id, tokenizer=tokenizer_hash(learner.tok), version=0, sampler=sampler,
                     created=1.0, completions=comps, sampling={"temperature": 1.0})
    assert learner.check(g) is None  # it would be acknowledged and journaled
    return g.encode()


def _answer(learner) -> str:
    return learner.task.get(learner.task.split("train")[0].id).answer


def test_the_learner_drops_a_group_over_its_budget_counts_it_and_credits_nothing(dataset):
    learner = _learner(DatasetTask(DatasetTaskConfig(train_files=(dataset,), eval_fraction=0.1)))
    right = f"\\boxed{{{_answer(learner)}}}"
    honest = _group(learner, [right] * 4 + ["\\boxed{999}"] * 4, sampler="honest")
    assert learner.ingest(honest) is None  # the worker's start is not a group's budget
    assert learner.buffer[-1].group.rewards == [1.0] * 4 + [0.0] * 4
    for texts in ([TOWER] * 8, [right] * 7 + [EVADES]):  # refused by the pre-check; past the deadline
        assert learner.ingest(_group(learner, texts)) == "reward_budget"
    assert learner.drops["reward_budget"] == 2 and sum(learner.drops.values()) == 2
    assert [b.sampler for b in learner.buffer] == ["honest"]  # never buffered, never trained on
    assert learner.untrained("attacker") == 0 and not learner.credit.peers
    assert learner.ingest(_group(learner, [right] * 8, sampler="honest")) is None  # scoring goes on


def test_a_custom_rewards_groups_are_held_to_the_deadline_at_the_learner(dataset):
    cfg = DatasetTaskConfig(train_files=(dataset,), eval_fraction=0.1, reward="helpers.slow_rewards:stubborn")
    learner = _learner(DatasetTask(cfg))
    answer, wrong = _answer(learner), str(int(_answer(learner)) + 1)
    assert learner.ingest(_group(learner, [answer] * 2 + [wrong] * 6, sampler="honest")) is None
    assert learner.ingest(_group(learner, [answer] * 7 + ["slow"])) == "reward_budget"
    assert learner.drops == {"reward_budget": 1}
    assert learner.ingest(_group(learner, [answer] * 3 + [wrong + " "] * 5, sampler="honest")) is None
    assert learner.buffer[-1].group.rewards == [1.0] * 3 + [0.0] * 5


# ---- scoring time as a budget: per proven key, and for all unproven keys together --------------------
def test_scoring_time_buckets_by_hand():
    from helpers.clock import Clock
    from node.learner.scoring_time import ScoringTime

    clock = Clock(0.0)
    st = ScoringTime(burst_s=2.0, rate_s=0.5, max_keys=2, clock=clock)
    assert st.allows("a", proven=False) and st.allows("b", proven=True)
    st.charge("a", False, 2.5)  # one group ran 2.5 s: the pool is at -0.5
    assert not st.allows("fresh", proven=False)  # every unproven key shares it
    assert st.allows("b", proven=True)  # a proven key has its own
    clock.t += 1.0  # +0.5: at 0, still not above it
    assert not st.allows("a", proven=False)
    clock.t += 0.1
    assert st.allows("a", proven=False)
    clock.t += 100.0
    st.charge("a", False, 0.0)
    assert st._pool.available("") == 2.0  # capped at the burst
    for k in ("p1", "p2", "p3"):  # past max_keys proven buckets, the least recently charged is forgotten
        st.charge(k, True, 5.0)
    assert st.allows("p1", proven=True) and not st.allows("p3", proven=True) and st.allows("fresh", proven=False)


def test_keys_whose_groups_run_to_the_deadline_spend_the_unproven_keys_share_and_no_more(dataset):
    """Each group of `sleepy` runs to its deadline (1 s): one per fresh key, the unproven keys' bucket
    empties and the next fresh key's group is not scored at all (counted), until it refills."""
    from helpers.clock import Clock
    from node.learner.scoring_time import SCORING_TIME, ScoringTime

    cfg = DatasetTaskConfig(train_files=(dataset,), eval_fraction=0.1, reward="helpers.slow_rewards:sleepy")
    learner = _learner(DatasetTask(cfg))
    answer = _answer(learner)
    assert learner.ingest(_group(learner, [answer] * 8, sampler="warm")) is None  # the worker's start
    clock = Clock(0.0)
    learner.scoring_time = ScoringTime(burst_s=1.5, clock=clock)  # a frozen clock: no refill meanwhile
    real, charged = learner.scoring_time.charge, []

    def charge(key: str, proven: bool, seconds: float) -> None:  # 1 s each, however long this CPU took past it
        charged.append(seconds)
        real(key, proven, 1.0)
    learner.scoring_time.charge = charge
    for key in ("k1", "k2"):
        assert learner.ingest(_group(learner, [answer] * 7 + ["slow"], sampler=key)) == "reward_budget"
    from node.tasks.bounded import worker_for

    asked = worker_for(cfg.reward).groups
    assert learner.ingest(_group(learner, [answer] * 7 + ["slow"], sampler="k3")) == SCORING_TIME
    assert worker_for(cfg.reward).groups == asked  # not scored: the thread that trains spent nothing on it
    assert learner.drops == {"reward_budget": 2, SCORING_TIME: 1}
    assert len(charged) == 2 and min(charged) >= 1.0, charged  # each ran to its deadline, charged in full
    clock.t += 10.0  # paid back at 0.5 s a second
    assert learner.ingest(_group(learner, [answer] * 6 + [answer + " "] * 2, sampler="k4")) is None
