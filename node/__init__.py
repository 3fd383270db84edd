"""node: the roles and the RL of hetero-node.

    tasks/       problems, splits and verifiable rewards
    algorithms/  policy losses (GRPO, Dr. GRPO, GSPO, GEPO, F-TIS), one pure function each
    engines/     generation engines (HF transformers; vLLM optional)
    logprobs.py  token log-probs, one code path for samplers and learners
    trainer.py   rollout groups -> a batch -> one optimizer step
    local.py     the single-process on-policy learning loop
"""
