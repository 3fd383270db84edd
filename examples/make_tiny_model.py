"""Make the built-in tiny model: a Qwen3-architecture transformer warm-started by supervised
training on the arithmetic task until it has a *partial* skill, so RL has room to improve it.

    python examples/make_tiny_model.py                       # node/assets/tiny-arith
    python examples/make_tiny_model.py --name tiny-arith-b --hidden 96 --layers 3 --seed 1
    python examples/make_tiny_model.py --task chain --name tiny-chain   # long scratchpad completions
    python examples/make_tiny_model.py --task chain-long --name tiny-chain-long --hidden 160 --layers 3 --seed 1 --eval-from 400 \
        --eval-every 5 --eval-size 100 --target-acc 0.5 --max-steps 4000    # longer: issue 61's second model

It trains from scratch on the train split (completion tokens only: the answer, or for the chain
task the worked scratchpad, node/tasks/chain.py), measures greedy eval
accuracy every `--eval-every` steps on held-out problems, and saves the first checkpoint whose
accuracy reaches `--target-acc`. The tokenizer is built locally (node.models.build_char_tokenizer);
nothing is downloaded. A MODEL_CARD.md beside the weights records the recipe and the result.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.paper_delay.run import GRID_TASKS, task_config  # noqa: E402  (the grids' task, one definition)
from node.engines.hf import HFEngine  # noqa: E402
from node.learner.evaluate import eval_problems, evaluate  # noqa: E402
from node.training.logprobs import completion_logprobs, pack  # noqa: E402
from node.models import ASSETS, build_char_tokenizer  # noqa: E402
from node.tasks import ArithmeticConfig, ArithmeticTask, ChainConfig, ChainTask  # noqa: E402

TASKS = {  # --task -> (the task, the completion it is taught, tokens an eval may generate, what the card says)
    "arithmetic": (lambda: ArithmeticTask(ArithmeticConfig()), lambda p: p.answer, 6,
                   "the built-in arithmetic task (`ArithmeticConfig()`: up to 2-digit addition, 2-digit x 1-digit "
                   "multiplication)"),
    "chain": (lambda: ChainTask(ChainConfig()), ChainTask.worked, 128,
              "the chain task (`ChainConfig()`: sums of 4-8 two-digit numbers worked out on a scratchpad, "
              "completions of 30-80 characters)"),
    "chain-long": (lambda: ChainTask(task_config("chain-long")), ChainTask.worked, GRID_TASKS["chain-long"][1],
                   "the chain task at longer completions (`ChainConfig(min_terms=8, max_terms=12)`: sums of 8-12 "
                   "two-digit numbers worked out on a scratchpad, completions of 72-124 characters)"),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="arithmetic", choices=sorted(TASKS))
    p.add_argument("--name", default="tiny-arith")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-steps", type=int, default=6000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-from", type=int, default=0,
                   help="no evaluation before this step (skill can jump within a few steps: evaluate densely there)")
    p.add_argument("--eval-size", type=int, default=400)
    p.add_argument("--target-acc", type=float, default=0.30)
    p.add_argument("--out", type=Path, default=None, help="folder to save to (default node/assets/NAME, i.e. builtin:NAME)")
    return p.parse_args()


def make_model(vocab_size: int, args: argparse.Namespace, tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2), head_dim=args.hidden // args.heads,
        max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
    )
    return Qwen3ForCausalLM(cfg)


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    rng = random.Random(args.seed)
    tok = build_char_tokenizer()
    model = make_model(len(tok), args, tok)
    make, target, max_new, _ = TASKS[args.task]
    task = make()
    train = list(task.split("train"))
    eval_set = eval_problems(task, args.eval_size)  # the held-out problems every command evaluates on
    engine = HFEngine(model, tok, f"builtin:{args.name}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    out = args.out or ASSETS / args.name
    t0, curve = time.time(), []
    for step in range(1, args.max_steps + 1):
        model.train()
        probs = rng.sample(train, args.batch)
        prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in probs]
        answers = [tok(target(p), add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for p in probs]
        batch = pack(prompts, answers, tok.pad_token_id)
        lp = completion_logprobs(model, batch, temperature=1.0)
        loss = -lp.sum() / batch.completion_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.eval_every == 0 and step >= args.eval_from:
            acc = evaluate(engine, task, eval_set, max_new_tokens=max_new)
            curve.append((step, round(acc, 4)))
            print(f"step {step:5d}  loss {loss.item():.3f}  eval_acc {acc:.3f}  {time.time() - t0:.0f}s", flush=True)
            if acc >= args.target_acc:
                break
    save(model, tok, out, args, curve, time.time() - t0)


def save(model, tok, out: Path, args, curve, seconds: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    card = f"""# {args.name}

A tiny Qwen3-architecture causal LM ({n_params / 1e6:.2f}M parameters, hidden {args.hidden},
{args.layers} layers, {args.heads} heads) with a character-level tokenizer built locally. Made by

    python examples/make_tiny_model.py {' '.join(sys.argv[1:])}

Supervised training from scratch on the train split of {TASKS[args.task][3]}, batch
{args.batch}, AdamW lr {args.lr}, seed {args.seed}; stopped at the first evaluation whose greedy
accuracy on {args.eval_size} held-out problems reached {args.target_acc:.0%}, so that RL has room.
Wall time {seconds:.0f} s on {torch.get_num_threads()} CPU threads.

Greedy eval accuracy during training (step, accuracy): {curve}
"""
    (out / "MODEL_CARD.md").write_text(card)
    (out / "training_curve.json").write_text(json.dumps(curve))
    print(f"saved {out} ({n_params / 1e6:.2f}M parameters)")


if __name__ == "__main__":
    main()
