"""No peer can steer training or farm credit: issue 13's attacks against a swarm of real processes.

Two loopback swarms, one after the other: a clean one (bootstrap, learner, one honest sampler)
and the same with attackers beside the honest sampler, each a real sampler process with its own
key that tampers with its groups before signing them (tests/helpers/attacker.py: forged log-probs,
chosen completions, garbage), plus a peer in this process with its own key that re-sends content
under new ids and sends a made-up model's groups whose text its tokens do not say. Every attack
is refused or neutralised and counted, the attackers are credited nothing, and the attacked model
learns as the clean one does (eval within noise at the same version).
"""

from __future__ import annotations

import time
import uuid

import msgpack
import pytest

from node.sampling.race import BASE_NONCE
from node.engines.hf import HFEngine
from node.models import BUILTIN_MODEL, load_model, load_tokenizer, tokenizer_hash
from node.sampling.sampler import Sampler
from node.tasks import ArithmeticTask
from swarm.dht.network import NetworkConfig
from swarm.wire.envelope import seal
from swarm.identity import Identity
from swarm.wire.batch import ROLLOUTS
from helpers.swarmkit import Swarm, peer_of, start_bootstrap

VERSION = 120
LEARNER_TOML = f"[learner]\neval_every = {VERSION // 2}\neval_size = 300\n"
MODES = ("logprobs", "chosen", "garbage")


def _run(base, attack: bool) -> dict:
    s = Swarm(base)
    try:
        start_bootstrap(s)
        s.start_learner(LEARNER_TOML)
        s.join("honest", "sampler", "--name", "honest")
        out: dict = {}
        if attack:
            for mode in MODES:
                s.join_attacker(mode, mode)
            s.wait_version(3, timeout=240)
            out["replies"] = _in_process_attacks(s)
        s.wait_version(VERSION, timeout=420)
        deadline = time.monotonic() + 120
        while not [r for r in s.metrics() if r["kind"] == "eval" and r["version"] >= VERSION]:
            assert time.monotonic() < deadline, "no eval at the final version"
            time.sleep(0.5)
        m = s.metrics()
        out["eval"] = [r for r in m if r["kind"] == "eval" and r["version"] >= VERSION][0]["eval_acc"]
        out["eval0"] = [r for r in m if r["kind"] == "eval"][0]["eval_acc"]
        out["last"] = [r for r in m if r["kind"] == "step"][-1]
        out["peers"] = {name: peer_of(s, name) for name in ("honest", *(MODES if attack else ()))}
        return out
    finally:
        s.stop_all()


def _in_process_attacks(s: Swarm) -> dict[str, str | list]:
    """Duplicate content under a new id, and a made-up model whose text its tokens do not say."""
    from swarm.p2p import SwarmNode

    ident = Identity.load_or_create(s.base / "attacker.key")
    node = SwarmNode(ident, NetworkConfig(initial_peers=[s.addr]), "demo")
    try:
        tok = load_tokenizer(BUILTIN_MODEL)
        sampler = Sampler(ident.peer_id, ArithmeticTask(), HFEngine(load_model(BUILTIN_MODEL), tok, BUILTIN_MODEL),
                          tokenizer_hash(tok), swarm="demo")
        assert sampler.nonce == BASE_NONCE  # version 0 of the base model: sampled honestly, checkable
        learner = peer_of(s, "learner")

        def send(g) -> str:
            """The learner's word on `g`. "busy" (past a bound, not refused) is sent again, as a sampler
            does: this key is unproven, and the attackers beside it share the unproven keys' pool
            (swarm/rollouts/admission.py), which CI once found spent at the moment of the first send."""
            deadline = time.monotonic() + 60
            while True:
                reply = msgpack.unpackb(node.call_gated(learner, ROLLOUTS, msgpack.packb([[g.id, seal(ident, g.encode())]]),
                                                  timeout=60), raw=False)
                if reply.get("error"):  # the whole batch refused: never sent again
                    return f"error: {reply['error']}"
                if g.id in reply["ok"] or g.id in reply["rejected"]:
                    return "ok" if g.id in reply["ok"] else reply["rejected"][g.id]
                assert g.id in reply["busy"] or reply.get("why"), reply  # busy: the item's, or the door's (unread)
                if time.monotonic() > deadline:
                    return "busy"
                busy.append(reply.get("why"))  # the bound it met, printed with the replies
                time.sleep(1.0)

        busy: list[str | None] = []  # of all three sends
        original = sampler.produce(1)[0]
        replies: dict = {"original": send(original), "busy replies, sent again": busy}
        time.sleep(5)  # the learner ingests it from its journal
        copy = msgpack.unpackb(original.encode(), raw=False)
        copy["id"] = uuid.uuid4().hex
        copy["completions"] = list(reversed(copy["completions"]))
        from swarm.wire.rollout import decode_rollout_group

        replies["same content, new id"] = send(decode_rollout_group(msgpack.packb(copy)))
        foreign = sampler.produce(1)[0]
        foreign.model_id, foreign.tokenizer = "made-up/model", "f" * 16
        foreign.completions[0].text = "12345"  # nothing any tokenizer we hold would check
        replies["made-up model and tokenizer"] = send(foreign)
        return replies
    finally:
        node.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {"clean": _run(tmp_path_factory.mktemp("clean"), attack=False),
            "attacked": _run(tmp_path_factory.mktemp("attacked"), attack=True)}


@pytest.mark.timeout(1200)
def test_every_attacker_is_refused_and_credited_nothing(runs, capsys):
    a = runs["attacked"]
    last, peers = a["last"], a["peers"]
    with capsys.disabled():
        print(f"\nattacked run at v{last['version']}: drops {last['drops']}, audit {last['audit']}, "
              f"credited {last['credited']}, log-prob gap drops {last['logprob_gap_drops']}, replies {a['replies']}")
    for mode in MODES:  # each failed its audits: refused for good, its credit revoked
        assert last["credited"].get(peers[mode], 0) == 0, mode
    assert last["refused_samplers"] == len(MODES) and last["audit"]["failed"] >= len(MODES)
    assert last["drops"].get("refused_sampler", 0) >= len(MODES)
    assert last["credited"].get(peers["honest"], 0) > 0
    assert a["replies"]["original"] == "ok"
    assert a["replies"]["made-up model and tokenizer"] == "unknown_tokenizer"
    dup = a["replies"]["same content, new id"]
    assert dup == "duplicate_content" or last["drops"].get("duplicate_content", 0) >= 1, dup


@pytest.mark.timeout(1200)  # as its sibling's: run alone or first, it builds `runs` (two whole training runs)
def test_the_attacked_model_learns_as_the_clean_one_and_honest_samplers_raise_no_flags(runs, capsys):
    clean, attacked = runs["clean"], runs["attacked"]
    with capsys.disabled():
        print(f"\neval at v{VERSION}: clean {clean['eval0']:.3f} -> {clean['eval']:.3f}, "
              f"attacked {attacked['eval0']:.3f} -> {attacked['eval']:.3f}; "
              f"honest audits clean {clean['last']['audit']}")
    # 300 eval problems: binomial sd ~0.028 per run, and runs differ in timing; clean runs measured
    # 0.57-0.65 at v120 and attacked ones 0.63, so "within noise" is a 0.10 band (derived under GRPO,
    # the default then; under gepo_lenclip two pairs measured clean 0.613, 0.633 and attacked 0.603, 0.630)
    assert attacked["eval"] >= clean["eval"] - 0.10
    assert attacked["eval"] > attacked["eval0"] + 0.05  # it keeps learning
    for run in (clean, attacked):  # the honest sampler: audited, never flagged
        assert run["last"]["audit"]["audits"] >= 4 and run["last"]["credited"].get(run["peers"]["honest"], 0) > 0
        assert run["last"]["logprob_gap_drops"].get(run["peers"]["honest"], 0) == 0
    assert clean["last"]["audit"]["failed"] == 0 and clean["last"]["refused_samplers"] == 0
