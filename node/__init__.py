"""node: the roles and the RL of hetero-node, no networking. From swarm/ it imports only the seam
(swarm.exchange) and the records (swarm.wire).

    config.py      the loader (TOML, then flags) and the blocks every command's root is made of
    tables.py      the tables every command reads alike: [task], [sampling], [learner]
    tasks/         problems, splits and verifiable rewards
    algorithms/    policy losses (GRPO, Dr. GRPO, GSPO, GEPO and gepo_lenclip, M2PO, F-TIS, pg), one pure function each
    engines/       generation engines (HF transformers; vLLM optional) and `make_engine`
    sampling/      how completions are drawn: the settings, checkable sampling's race, the sampler role
    training/      one optimizer step: batches, micro-batches, log-probs, the guard, FSDP2
    audit/         spot audits: the version archive, margins, flips, refusals, the Auditor
    weights/       versions: the view, lossless patches and keyframes, their coder, publishing
    learner/       the learner role: its intake, buffer, books, credit, checkpoints, evaluation
    models.py      loading models and tokenizers (and the built-in tiny ones)
    device.py      where a node computes, in which precision
    metrics.py     metrics records: JSONL (and TensorBoard), the keys read beyond their writer
    local.py       the single-process on-policy learning loop (`hetero-node local`)
"""
