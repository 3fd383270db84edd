"""Helpers the tests share (imported as `helpers.<module>`: pyproject's pytest `pythonpath` puts
tests/ on sys.path). None is a test file; importing this package imports none of them.

    attacker.py      a sampler process that tampers with its groups (python -m tests.helpers.attacker)
    edits.py         a cheat's token past the audit's margin, claimed with its honest log-prob
    emulated.py      what the swarms on an emulated network share (test_wan, test_internet)
    external.py      what a test needs from outside Python (Chromium, vLLM): skip, or fail in CI
    fsdp_worker.py   one torchrun rank for test_distributed_ranks (torchrun tests/helpers/fsdp_worker.py)
    inmemory.py      a tiny learner, its samplers and a MemoryExchange in one process (tiny_swarm)
    intake.py        a stand-in learner behind a real RolloutReceiver, and signed items to send it
    leaderboard.py   tallies as learners sign them, the leaderboard served in a thread, raw sockets
    memory_probe.py  one learner step's peak memory in a fresh process (python tests/helpers/memory_probe.py)
    numerics.py      tolerances derived from float32 rounding (float32_logprob_tol)
    readme.py        the README's "Join a swarm" commands, read from README.md
    repo.py          where the repository is (ROOT) and these helpers (HELPERS), for any test's depth
    slow_rewards.py  rewards, and answers, that cost more than any budget to score
    swarmkit.py      a swarm of real node processes on 127.0.0.1, and a forger of signed rollouts
    sybils.py        many fresh keys at once, each a bare libp2p peer dialled to the learner
"""
