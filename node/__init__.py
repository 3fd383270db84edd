"""node: the roles and the RL of hetero-node. It never imports swarm/'s networking: only the seam
(swarm.exchange) and the wire records (swarm.wire.rollout).

    config.py      the typed config tree ([task], [sampling], [learner]) and its checked loader
    tasks/         problems, splits and verifiable rewards
    algorithms/    policy losses (GRPO, Dr. GRPO, GSPO, GEPO, F-TIS, pg), one pure function each
    engines/       generation engines (HF transformers; vLLM optional) and `make_engine`
    logprobs.py    token log-probs, one code path for samplers and learners
    trainer.py     rollout groups -> a batch -> one optimizer step
    sampler.py     the sampler role; learner.py the learner role (validate, route, train, publish)
    guard.py       the divergence guard: the learner's lr from the divergence it measures
    weight_codec.py, weights.py  versions as keyframes and patches; blobs of tensors
    entropy.py     patches' gaps and steps at their empirical entropy (ANS)
    checkpoint.py  learner state on disk; accounting.py credit per sampler; metrics.py JSONL + TensorBoard
    local.py       the single-process on-policy learning loop
"""
