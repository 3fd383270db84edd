"""What fits where: the memory each role needs, this machine, and whether one fits the other.

    shape = model_shape("Qwen/Qwen3-1.7B")       # shape.py: from config.json alone, never downloaded
    need = needs("learner", "hf", shape, work)   # needs.py: GPU, RAM and disk bytes, each constant derived
    machine = probe_machine(workdir)             # machine.py: GPUs, RAM, disk, versions; never raises
    v = verdict("learner", "hf", shape, machine, work)   # verdict.py: ok, what does not fit, the fix
    fit_table()                                  # table.py: the README's table

One source for this arithmetic: README's table, `hetero-node doctor`, join's preflight
(cli/doctor.py `check_machine`) and the vLLM engine's automatic settings
(node/engines/vllm_settings.py) all read it here.
"""

from node.fit.machine import Gpu, Machine, probe_machine
from node.fit.needs import GIB, Needs, Role, Workload, needs
from node.fit.shape import QWEN3, ModelShape, ShapeUnknown, model_shape, qwen3_shapes
from node.fit.table import fit_table
from node.fit.verdict import LearnerOption, Verdict, learner_option, verdict

__all__ = ["GIB", "QWEN3", "Gpu", "LearnerOption", "Machine", "ModelShape", "Needs", "Role", "ShapeUnknown",
           "Verdict", "Workload", "fit_table", "learner_option", "model_shape", "needs", "probe_machine",
           "qwen3_shapes", "verdict"]
