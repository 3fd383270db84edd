"""Honest groups for a dataset task scored by math-verify: what a model's final answers to MATH- and
GSM8K-style problems look like, right or wrong, after a few sentences of working.

`honest_groups(n, size)` gives n groups of `size` completions, one gold answer each, its completions
answers of the gold's form (a group answers one question). examples/bench_reward_budget.py measures
what they cost to score; tests/unit/node/test_reward_budget.py checks they all pass the pre-check
and score right within the budget.
"""

from __future__ import annotations

import random

KINDS = ("int", "bigint", "negint", "decimal", "comma_int", "frac", "slash", "mixed_sqrt", "sqrt_frac",
         "interval", "poly", "pi", "tuple", "set", "text", "pmatrix", "percent", "expo", "log", "deg", "noboxed")


def _answer(kind: str, p: random.Random, right: bool, r: random.Random) -> tuple[str, str]:
    """(gold, predicted) of `kind`: the gold from `p` (the same for the whole group), the prediction
    an equivalent form if `right`, else a wrong one, different for each completion (`r`): a model's
    wrong attempts differ, and each costs math-verify a parse of its own."""
    k = r.randint(2, 9)
    if kind == "int":
        g = p.randint(0, 1000)
        return str(g), str(g if right else g + r.randint(1, 99))
    if kind == "bigint":
        g = p.randint(10**6, 10**12)
        return str(g), str(g if right else g + r.randint(1, 10**6))
    if kind == "negint":
        g = -p.randint(1, 500)
        return str(g), str(g if right else g - r.randint(1, 99))
    if kind == "decimal":
        g = round(p.uniform(0, 100), 2)
        return str(g), str(g if right else round(g + r.randint(1, 999) / 100, 2))
    if kind == "comma_int":
        g = p.randint(1000, 999999)
        return str(g), f"{g:,}" if right else f"{g + r.randint(1, 999):,}"
    if kind == "frac":
        a, b = p.randint(1, 99), p.randint(2, 99)
        return f"\\frac{{{a}}}{{{b}}}", (f"\\frac{{{k * a}}}{{{k * b}}}" if right else f"\\frac{{{a + k}}}{{{b}}}")
    if kind == "slash":
        a, b = p.randint(1, 99), p.randint(2, 99)
        return f"{a}/{b}", (f"\\dfrac{{{a}}}{{{b}}}" if right else f"{b + k}/{a}")
    if kind == "mixed_sqrt":
        a, b = p.randint(2, 9), p.choice([2, 3, 5, 6, 7])
        return f"{a}\\sqrt{{{b}}}", (f"\\sqrt{{{a * a * b}}}" if right else f"{a + k}\\sqrt{{{b}}}")
    if kind == "sqrt_frac":
        b, c = p.choice([2, 3, 5]), p.randint(2, 9)
        return f"\\frac{{\\sqrt{{{b}}}}}{{{c}}}", f"\\frac{{{1 if right else k + 1}}}{{{c}}}\\sqrt{{{b}}}"
    if kind == "interval":
        a, b = sorted(p.sample(range(-20, 20), 2))
        return f"[{a}, {b})", (f"\\left[{a}, {b}\\right)" if right else f"({a - k}, {b}]")
    if kind == "poly":
        a, b = p.randint(1, 9), p.randint(1, 9)
        return f"x^2+{a + b}x+{a * b}", (f"(x+{a})(x+{b})" if right else f"x^2+{a * b + k}x+{a + b + 1}")
    if kind == "pi":
        a = p.randint(2, 50)
        return f"{a}\\pi", (f"\\pi \\cdot {a}" if right else f"{a + k}\\pi")
    if kind == "tuple":
        a, b = p.randint(-9, 9), p.randint(10, 19)
        return f"({a}, {b})", (f"\\left({a},{b}\\right)" if right else f"({b + k}, {a})")
    if kind == "set":
        xs = p.sample(range(-9, 20), 3)
        return "\\{" + ", ".join(map(str, xs)) + "\\}", ", ".join(map(str, reversed(xs) if right else [*xs[:2], 20 + k]))
    if kind == "text":
        ch = p.choice("ABCDE")
        return f"\\text{{({ch})}}", f"\\text{{({ch if right else 'A' if ch != 'A' else 'B'})}}"
    if kind == "pmatrix":
        a, b = p.randint(-9, 9), p.randint(10, 19)
        gold = f"\\begin{{pmatrix}} {a} \\\\ {b} \\end{{pmatrix}}"
        return gold, (gold if right else f"\\begin{{pmatrix}} {b + k} \\\\ {a} \\end{{pmatrix}}")
    if kind == "percent":
        a = p.randint(1, 99)
        return str(a), (f"{a}\\%" if right else f"{a + k}\\%")
    if kind == "expo":
        a, b = p.randint(2, 9), p.randint(2, 12)
        return str(a ** b), (f"{a}^{{{b}}}" if right else f"{a}^{{{b + k}}}")
    if kind == "log":
        a = p.randint(3, 9)
        return f"\\log_2 {a}", (f"\\frac{{\\ln {a}}}{{\\ln 2}}" if right else f"\\log_3 {a + k}")
    if kind == "deg":
        a = p.choice([30, 45, 60, 90, 120])
        return f"{a}^\\circ", (f"{a}" if right else f"{a + k}")
    if kind == "noboxed":
        g = p.randint(0, 1000)
        return str(g), str(g if right else g + k)
    raise ValueError(kind)


def honest_groups(n: int, size: int = 8, seed: int = 0) -> list[tuple[str, str, list[tuple[str, bool]]]]:
    """n groups: (kind, gold, [(completion, right), ...]); kinds in turn, half the answers right."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind, group_seed = KINDS[i % len(KINDS)], rng.random()
        comps, gold = [], ""
        for _ in range(size):
            right = rng.random() < 0.5
            gold, pred = _answer(kind, random.Random(group_seed), right, rng)
            if kind == "noboxed":  # a model that forgot the box: math-verify reads all of the text
                work = " ".join(f"Step {k}: {rng.randint(1, 99)} + {rng.randint(1, 99)} makes {rng.randint(2, 198)}."
                                for k in range(rng.randint(3, 30)))
                comps.append((f"{work} So the answer is {pred}.", right))
            else:
                work = " ".join(f"Then ${rng.randint(1, 99)} \\cdot {rng.randint(1, 9)} = {rng.randint(1, 900)}$."
                                for _ in range(rng.randint(1, 20)))
                comps.append((f"Let us compute. {work} Therefore the answer is $\\boxed{{{pred}}}$.", right))
        out.append((kind, gold, comps))
    return out
