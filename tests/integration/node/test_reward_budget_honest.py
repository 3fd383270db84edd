"""Honest groups score within the product's budget on this CPU (node/tasks/bounded.py: a completion's
share, PER_COMPLETION_S, is twice the p99.9 of honest answers measured). A property of the machine as
much as of the code, so an integration test: the fast one (tests/unit/node/test_reward_budget.py)
checks the worker's scores with a budget no CPU misses, and what a group past its budget costs."""

from helpers.honest_answers import KINDS, honest_groups
from node.tasks import math_verify_reward
from node.tasks.bounded import RewardWorker


def test_honest_groups_score_within_the_products_budget():
    w = RewardWorker("math_verify")  # the product's budget (group_budget_s) and grace
    try:
        for kind, gold, comps in honest_groups(len(KINDS) * 4, seed=11):
            texts = [t for t, _ in comps]
            # past its budget the worker raises OverBudget: the learner would drop an honest group
            assert w.rewards(texts, gold) == [math_verify_reward(x, gold) for x in texts], (kind, gold)
        assert w.kills == 0
    finally:
        w.close()
