"""An attacker's sampler for tests/integration/node/test_steering.py: a real `hetero-node join
--role sampler` process, with its own key, that tampers with its groups before it signs and sends
them.

    python -m tests.helpers.attacker MODE join --role sampler --initial-peers ... [join options]

MODE (the attacks of issue 13, as a stranger would run them):
    logprobs   honest tokens, claimed behaviour log-probs of -18/token (inflated importance weights)
    chosen     completions chosen, not sampled: the answer plus one extra digit (marked wrong),
               with a realistic claimed log-prob of -2/token
    garbage    random in-vocabulary tokens, text matching them, log-probs -0.5 (credit farming)

and of issue 61's audit, for tests/integration/swarm/test_adversary.py:
    margin_edit   in every completion, one token replaced by one 1.5 to 7.5 logits behind its race's
               pick (past the audit's margin, within its hard bound), claimed with its honest
               log-prob, the completion cut there (helpers/edits.py): what honest rounding does rarely

and of issue 26:
    foreign    a made-up model id in our tokenizer (to take the unaudited foreign route), one right
               answer among wrong ones, claimed log-probs -30/token, a made-up chain
    foreign_ourchain   the same under the learner's real chain and version (so only an audit stops it)
    oldchain:CHAIN:V   honest tokens claiming version V of CHAIN (a previous run's, from its public
               manifest), which the restarted learner cannot rebuild to audit
"""

from __future__ import annotations

import os
import random
import sys

from tests.helpers.edits import edit_past_margin  # run as `python -m tests.helpers.attacker`
from node.learner.config import AuditConfig
from node.sampling import sampler as sampler_mod
from node.sampling.race import group_seeds


def tamper(mode: str, g, sampler) -> None:
    tok = sampler.engine.tokenizer
    answer = sampler.task.get(g.prompt_id).answer
    rng = random.Random(g.id)
    if mode.startswith("oldchain:"):
        _, g.chain, version = mode.split(":")
        g.version = int(version)
        return
    if mode in ("foreign", "foreign_ourchain"):
        g.model_id = "made-up/model"  # our tokenizer's hash stays: the tokens are ours to check
        if mode == "foreign":
            g.chain = "made-up-chain"
        for i, c in enumerate(g.completions):
            c.text = answer if i == 0 else answer + str(rng.randrange(10))
            c.token_ids = tok(c.text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            c.logprobs, c.finish_reason, c.reward = [-30.0] * len(c.token_ids), "stop", float(i == 0)
        return
    if mode == "margin_edit":
        seeds = group_seeds(sampler.nonce, g.prompt_id, sampler.peer_id, len(g.completions))
        for c, seed in zip(g.completions, seeds):
            try:
                edit_past_margin(sampler.engine.model, tok, sampler.sampling.params, seed, c, g.prompt, 1.5, 7.5,
                                 AuditConfig.margin, AuditConfig.margin_hard)
            except AssertionError:  # no such token anywhere in it: sent as drawn
                continue
            c.reward = float(sampler.task.reward(c.text, answer))
        return
    for c in g.completions:
        if mode == "logprobs":
            c.logprobs = [-18.0] * len(c.token_ids)
        elif mode == "chosen":
            c.text = answer + str(rng.randrange(10))
            c.token_ids = tok(c.text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            c.logprobs, c.finish_reason, c.reward = [-2.0] * len(c.token_ids), "stop", 0.0
        elif mode == "garbage":
            c.token_ids = [rng.randrange(3, len(tok)) for _ in range(rng.randrange(1, 6))]
            c.text = tok.decode(c.token_ids, skip_special_tokens=True)
            c.logprobs, c.finish_reason, c.reward = [-0.5] * len(c.token_ids), "length", 0.0
        else:
            raise SystemExit(f"unknown attack mode {mode!r}")


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    os.nice(10)  # the attack is in what it sends, not in starving the honest processes of this 2-core machine
    produce = sampler_mod.Sampler.produce

    def tampered(self, n_prompts=None):
        groups = produce(self, n_prompts)
        for g in groups:
            tamper(mode, g, self)
        return groups

    sampler_mod.Sampler.produce = tampered
    from cli.main import main as cli_main

    sys.argv = ["hetero-node", *args]
    cli_main()


if __name__ == "__main__":
    main()
