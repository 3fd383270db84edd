"""Helpers the tests share (imported as `helpers.<module>`: pyproject's pytest `pythonpath` puts
tests/ on sys.path). None is a test file; importing this package imports none of them.

    attacker.py      a sampler process that tampers with its groups (python -m tests.helpers.attacker)
    external.py      what a test needs from outside Python (Chromium, vLLM): skip, or fail in CI
    fsdp_worker.py   one torchrun rank for test_distributed (torchrun tests/helpers/fsdp_worker.py)
    inmemory.py      a tiny learner, its samplers and a MemoryExchange in one process (tiny_swarm)
    memory_probe.py  one learner step's peak memory in a fresh process (python tests/helpers/memory_probe.py)
    numerics.py      tolerances derived from float32 rounding (float32_logprob_tol)
    swarmkit.py      a swarm of real node processes on 127.0.0.1, and a forger of signed rollouts
    sybils.py        many fresh keys at once, each a bare libp2p peer dialled to the learner
"""
