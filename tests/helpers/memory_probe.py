"""Peak memory of one learner step, in a fresh process (run by
tests/integration/node/test_memory.py).

    python tests/helpers/memory_probe.py BUDGET GROUPS [full]

Prints the step's peak resident memory above what the process held before it, in bytes. With
`full`, log-probs take the full-logits path ([B, L, V] float32: what the learner did before it
computed completion positions in chunks). Run with MALLOC_MMAP_THRESHOLD_=65536 so that freed
blocks go back to the system and the resident set follows live tensors.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root

from examples.bench_learner import PeakMemory, make_parts  # noqa: E402
from examples.model_shapes import build  # noqa: E402
from node.training.step import StepOptions, train_step  # noqa: E402

budget, groups = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
model = build("wide-vocab-tiny")
if sys.argv[3:] == ["full"]:
    model.get_output_embeddings = lambda: None  # node.training.logprobs then takes the full-logits path
parts = make_parts(model.config.vocab_size, groups, 4, 8, 24)
opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
options = StepOptions(budget or None)
train_step(model, opt, parts, 1.0, 1.0, options)  # warm-up: AdamW allocates its state
with PeakMemory(torch.device("cpu")) as mem:
    train_step(model, opt, parts, 1.0, 1.0, options)
print(mem.peak)
