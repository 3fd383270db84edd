"""One optimizer step: batches, micro-batches and losses, log-probs, the divergence guard, FSDP2 across processes."""
