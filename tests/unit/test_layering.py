"""The layers (docs/DESIGN.md, "Layout"): cli/ -> node/ -> swarm/, each importing only the one below it.

Every .py file of a layer, in every subfolder, is parsed with `ast`, and every import in it is
checked, wherever it stands (module level, inside a function, under `if TYPE_CHECKING:`): `import
a.b`, `from a import b`, relative imports resolved against the file's package, and
`importlib.import_module` / `__import__` of a literal name. A failure lists each offending file, its
line and the import.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

from helpers.repo import ROOT


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of everything `path` imports. `import a.b` gives a.b; `from a
    import b` gives a.b (b a module or a name in a), `from a import *` gives a; in package p.q,
    `from .r import s` gives p.q.r.s and `from .. import t` gives p.t."""
    package = path.relative_to(root).with_suffix("").parts[:-1]  # p/q/r.py and p/q/__init__.py: p.q
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[:max(len(package) - node.level + 1, 0)] if node.level else ()
            module = ".".join((*base, *(node.module.split(".") if node.module else ())))
            for alias in node.names:
                yield node.lineno, module if alias.name == "*" else f"{module}.{alias.name}".lstrip(".")
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")
              and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")):
            yield node.lineno, node.args[0].value


def within(name: str, *modules: str) -> bool:
    """Whether `name` is one of `modules` or inside one (torch.nn is in torch; torchvision is not)."""
    return any(name == m or name.startswith(m + ".") for m in modules)


def violations(layer: str, why: Callable[[str], str | None], root: Path = ROOT) -> list[str]:
    """"file:line imports NAME: why" for every import under root/layer, in every subfolder, that
    `why` objects to (it returns the reason, or None)."""
    found = []
    for path in sorted((root / layer).rglob("*.py")):
        for line, name in sorted(imports(path, root)):
            if reason := why(name):
                found.append(f"{path.relative_to(root)}:{line} imports {name}: {reason}")
    return found


def swarm_rule(name: str) -> str | None:
    if name.split(".")[0].startswith("torch") or within(name, "transformers"):
        return "swarm/ knows bytes and records, never torch models"
    if within(name, "node", "cli"):
        return "swarm/ is the bottom layer: it imports neither node/ nor cli/"
    return None


SEAM = ("swarm.exchange", "swarm.wire")


def node_rule(name: str) -> str | None:
    if within(name, "cli"):
        return "node/ is below cli/: an arrow up"
    if within(name, "swarm") and not within(name, *SEAM):
        return f"node/ meets swarm/ only at the seam and the records ({', '.join(SEAM)})"
    return None


def test_swarm_never_imports_torch_node_or_cli():
    """docs/DESIGN.md, "Layout": swarm/ knows bytes and records, never torch models or node/ code."""
    found = violations("swarm", swarm_rule)
    assert not found, "swarm/ imports what it must not:\n" + "\n".join(found)


def wire_rule(name: str) -> str | None:
    if within(name, "swarm") and not within(name, "swarm.wire", "swarm.identity"):
        return "swarm/wire is the bottom of swarm/: every record's type, imported by the rest, importing none of it"
    return swarm_rule(name)


def test_the_wire_records_import_nothing_of_swarm_but_themselves_and_the_keys():
    """docs/DESIGN.md, "Layout": swarm/wire/ holds every record and message; node/ and every part of
    swarm/ import it, so it imports none of them (a record's type never waits on a network part)."""
    found = violations("swarm/wire", wire_rule)
    assert not found, "swarm/wire imports what it must not:\n" + "\n".join(found)


def test_node_never_imports_cli_and_meets_swarm_only_at_the_seam_and_the_records():
    """node/ imports from swarm/ only the seam (exchange) and the wire records, and nothing of cli/."""
    found = violations("node", node_rule)
    assert not found, "node/ imports what it must not:\n" + "\n".join(found)


def test_the_check_walks_subfolders_and_resolves_every_kind_of_import(tmp_path):
    """The checker itself, on a made-up tree: a forbidden import two folders down is found, with
    its file and line, in each form; a relative import is resolved against its package, so
    swarm.sub.node is not node."""
    deep = tmp_path / "swarm" / "sub" / "deep"
    deep.mkdir(parents=True)
    (deep / "__init__.py").write_text("from . import node\nfrom .. import torch_free\n")
    (deep / "store.py").write_text(
        "from __future__ import annotations\n"
        "import numpy, torch.nn\n"
        "from .node import helper\n"
        "def f():\n"
        "    from node.learner import Learner\n"
        "    from cli import main\n"
        "    import importlib\n"
        "    return importlib.import_module('transformers')\n")
    assert sorted(imports(deep / "__init__.py", tmp_path)) == [(1, "swarm.sub.deep.node"), (2, "swarm.sub.torch_free")]
    assert violations("swarm", swarm_rule, tmp_path) == [
        "swarm/sub/deep/store.py:2 imports torch.nn: swarm/ knows bytes and records, never torch models",
        "swarm/sub/deep/store.py:5 imports node.learner.Learner: swarm/ is the bottom layer: it imports neither node/ nor cli/",
        "swarm/sub/deep/store.py:6 imports cli.main: swarm/ is the bottom layer: it imports neither node/ nor cli/",
        "swarm/sub/deep/store.py:8 imports transformers: swarm/ knows bytes and records, never torch models",
    ]
    assert [node_rule(n) is None for n in ("swarm.exchange", "swarm.wire.rollout.RolloutGroup", "swarm.memory",
                                           "swarm.exchangeX", "swarm", "cli.main")] == [True, True, False, False, False, False]
