"""Loading causal LMs and tokenizers, and building the built-in tiny model's pieces.

Any Hugging Face causal LM loads from a local folder or a hub id (the hub path is for users;
tests and the demo use the model shipped in `node/assets/`). The built-in model is a tiny
Qwen3-architecture transformer with a character-level tokenizer built locally, warm-started by
`examples/make_tiny_model.py`.
"""

from __future__ import annotations

import contextlib
import logging
import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

ASSETS = Path(__file__).parent / "assets"
BUILTIN_MODEL = "builtin:tiny-arith"
"""Model id of the shipped tiny model; resolves to `node/assets/tiny-arith`."""
BUILTIN_MODEL_B = "builtin:tiny-arith-b"
"""A second, differently shaped tiny model (other size, other seed) for heterogeneous swarms."""
BUILTIN_MODEL_C = "builtin:tiny-arith-c"
"""A third shape (narrow and deep: hidden 64, 5 layers) for swarms of several learners."""

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
CHARS = string.digits + "+-*/=()., " + string.ascii_letters + "?!:;'\"\n\\{}[]^_%$#&<>|~`@"


class ModelNotFoundError(FileNotFoundError):
    """A model id that names no model we can load: the message says which, `fix` what to pass."""

    fix = ("give a folder saved with save_pretrained (config.json, weights, tokenizer), a hub id like "
           "Qwen/Qwen3-0.6B (needs internet), or builtin:tiny-arith")


def resolve_model_path(model_id: str) -> str:
    """Local folder for `builtin:NAME` or a path; anything else is a hub id, passed on as is.

    Checks what can be checked without loading: a builtin or a path-like id must be a folder with
    a config.json, and a hub id must be in the local cache or the hub must answer (`check_hub_id`),
    so a typo or a machine offline fails at once, in one line, not deep inside transformers."""
    if model_id.startswith("builtin:"):
        path = ASSETS / model_id.split(":", 1)[1]
        if not (path / "config.json").exists():
            known = sorted(f"builtin:{p.name}" for p in ASSETS.iterdir() if (p / "config.json").exists())
            raise ModelNotFoundError(f"no built-in model {model_id!r} (built-in: {', '.join(known)})")
        return str(path)
    path = Path(model_id).expanduser()
    looks_local = model_id.startswith((".", "/", "~")) or path.exists() or model_id.count("/") > 1
    if looks_local and not (path / "config.json").is_file():
        why = "no such folder" if not path.exists() else "the folder has no config.json"
        raise ModelNotFoundError(f"model {model_id!r}: {why}")
    if looks_local:
        return str(path)
    check_hub_id(model_id)
    return model_id


HUB_PROBE_S = 4.0
"""How long a hub id that is not in the local cache waits to learn whether the hub answers at all.
Unchecked, huggingface_hub retries an unreachable hub for about a minute, a warning a try, before
transformers gives up on the first file."""


def check_hub_id(model_id: str) -> None:
    """A hub id loads if it is in the local Hugging Face cache or the hub (huggingface_hub's endpoint,
    HF_ENDPOINT) answers: else ModelNotFoundError now, in one line. With HF_HUB_OFFLINE set, the hub
    is not asked. An id the hub does not have is transformers' to say (`_hub_errors`)."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError

    try:
        cached = huggingface_hub.try_to_load_from_cache(model_id, "config.json")
    except HFValidationError:
        raise ModelNotFoundError(f"model {model_id!r} is neither a folder nor a hub id like Qwen/Qwen3-0.6B") from None
    if isinstance(cached, str):
        return
    where = f"model {model_id!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    if huggingface_hub.is_offline_mode():
        e = ModelNotFoundError(f"{where}, and HF_HUB_OFFLINE is set")
    else:
        why = _hub_unreachable(constants.ENDPOINT)
        if why is None:
            return
        e = ModelNotFoundError(f"{where}, and the hub ({constants.ENDPOINT}) cannot be reached ({why})")
    e.fix = (f"give a local folder saved with save_pretrained, or builtin:tiny-arith; or download it first "
             f"where the hub is reachable (`hf download {model_id}` fills the cache)"
             + ("; or unset HF_HUB_OFFLINE" if huggingface_hub.is_offline_mode() else ""))
    raise e


def _hub_unreachable(endpoint: str) -> str | None:
    """Why the hub at `endpoint` does not answer within HUB_PROBE_S (any HTTP answer will do), or None.
    On a thread, so that a name lookup that hangs (no timeout of the HTTP client covers it) is bounded too."""
    import threading

    from huggingface_hub.utils import get_session  # the client the hub's own calls use (proxies and all)

    result: list[str | None] = []

    def ask() -> None:
        try:
            get_session().head(endpoint, timeout=HUB_PROBE_S)
            result.append(None)
        except Exception as e:  # noqa: BLE001 (whatever the client raises, the hub did not answer)
            result.append(" ".join(str(e).split()) or type(e).__name__)

    asker = threading.Thread(target=ask, name="hub-probe", daemon=True)
    asker.start()
    asker.join(HUB_PROBE_S + 1)
    return result[0] if result else f"no answer in {HUB_PROBE_S:g} s"


def build_char_tokenizer() -> "PreTrainedTokenizerBase":
    """A character-level tokenizer: one token per character, unknown characters map to <unk>.

    Built with `tokenizers` (WordLevel over single characters) and wrapped as a regular
    `PreTrainedTokenizerFast`, so it saves and loads like any hub tokenizer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left", model_max_length=256,
    )


def tokenizer_hash(tok: "PreTrainedTokenizerBase") -> str:
    """Short hash of a tokenizer's vocabulary: equal hashes mean token ids are interchangeable."""
    import hashlib
    import json

    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.blake2b(json.dumps(vocab).encode(), digest_size=8).hexdigest()


@contextlib.contextmanager
def _hub_errors(model_id: str):
    """transformers' OSError for an id it cannot find or download, as one line with the fix."""
    try:
        yield
    except ModelNotFoundError:
        raise
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelNotFoundError(f"could not load model {model_id!r} ({first})") from e


def load_tokenizer(model_id: str) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    with _hub_errors(model_id):
        tok = AutoTokenizer.from_pretrained(resolve_model_path(model_id))
    if tok.pad_token is None:  # many causal LMs ship without one; generation needs it
        tok.pad_token = tok.eos_token
    return tok


def eos_token_ids(tokenizer: "PreTrainedTokenizerBase", model_id: str) -> list[int]:
    """The token ids a completion stops on: the tokenizer's EOS first, then those of the model's
    `generation_config.json` (an int or a list), without repeats.

    Instruct models stop on more than one id (Qwen3: <|im_end|> and <|endoftext|>), and their
    tokenizer names only one. The generation config is read from the model's folder, or from the
    local hub cache for a hub id; never from the network. A model without one (or one that cannot
    be read) stops on the tokenizer's EOS alone.
    """
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    local = False
    try:
        path = resolve_model_path(model_id)
        local = Path(path).is_dir()
        if local and not (Path(path) / "generation_config.json").is_file():
            return ids
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(path, local_files_only=True).eos_token_id
    except Exception as e:  # a hub id not in the local cache, or a generation config that does not parse
        (log.warning if local else log.debug)(
            "%s: generation config not read (%s); stopping on the tokenizer's EOS only", model_id, e)
        return ids
    for i in [] if gen is None else [gen] if isinstance(gen, int) else gen:
        if int(i) not in ids:
            ids.append(int(i))
    return ids


def load_model(model_id: str, dtype: "torch.dtype | None" = None, device: str = "cpu") -> "PreTrainedModel":
    """A causal LM in eval mode on `device` (float32 on CPU unless `dtype` says otherwise)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load clutters logs of long-running nodes

    with _hub_errors(model_id):
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_id), dtype=dtype or torch.float32)
    log.info("loaded %s: %.2fM parameters", model_id, sum(p.numel() for p in model.parameters()) / 1e6)
    return without_dropout(model).to(device).eval()


def without_dropout(model: "torch.nn.Module") -> "torch.nn.Module":
    """`model` with every dropout rate 0 (in place): its modules', its attention's and its config's.

    Why: a learner trains in train mode (gradient checkpointing needs it), and with dropout on its
    forward is a random function, not the policy the samplers ran: an on-policy ratio p/q would not
    be 1, the clips and M2PO's mask would fire on noise, the guard's k3 would rise. TRL disables it
    the same way (`disable_dropout`). Qwen3 and most RL models ship with rates 0; GPT-2, OPT and
    Phi do not. Attention implementations read a float attribute (`attention_dropout`,
    `attn_pdrop`...), not an nn.Dropout, so those floats are zeroed too."""
    import torch

    def rate(name: str, value: object) -> bool:
        return isinstance(value, float) and not isinstance(value, bool) and (
            name.endswith("dropout") or name.endswith("pdrop") or name.endswith("dropout_prob"))

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if rate(name, value):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    for name, value in (config.to_dict() if config is not None else {}).items():
        if rate(name, value):
            setattr(config, name, 0.0)
    return model


def model_files(model_id: str, tokenizer: "PreTrainedTokenizerBase") -> dict[str, bytes]:
    """What a sampler needs to run `model_id` besides its weights, by file name: its config, its
    generation config (the EOS ids a completion stops on) and its tokenizer as `tokenizer` saves it
    (a learner serves them: swarm/model_files.py). Only names a model folder reads (FILE_NAMES)."""
    import tempfile

    from transformers import AutoConfig

    from swarm.wire.model_files import FILE_NAMES

    with _hub_errors(model_id):
        config = AutoConfig.from_pretrained(resolve_model_path(model_id))
    with tempfile.TemporaryDirectory(prefix="hetero-files-") as folder:
        config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        source = Path(resolve_model_path(model_id)) / "generation_config.json"
        if source.is_file():
            (Path(folder) / "generation_config.json").write_bytes(source.read_bytes())
        else:  # a hub id: its cached generation config, if any (never the network)
            with contextlib.suppress(Exception):
                from transformers import GenerationConfig

                GenerationConfig.from_pretrained(model_id, local_files_only=True).save_pretrained(folder)
        return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.name in FILE_NAMES}


def has_weights(folder: str | Path) -> bool:
    """Whether a model folder holds weights (a bundle's folder holds none: they come as a keyframe)."""
    return any(Path(folder).glob("*.safetensors")) or any(Path(folder).glob("pytorch_model*.bin"))


def empty_model(folder: str | Path, dtype: "torch.dtype | None" = None, device: str = "cpu") -> "PreTrainedModel":
    """The causal LM of `folder`'s config, its weights not initialised (a sampler loads the learner's
    keyframe into it before it generates anything): no weights file, and none of the time random
    initialisation takes at size. Buffers computed from the config (rotary frequencies) are set."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = AutoConfig.from_pretrained(folder)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    log.info("built %s from its config (weights from the learner): %.2fM parameters", folder,
             sum(p.numel() for p in model.parameters()) / 1e6)
    return without_dropout(model).to(device).eval()
