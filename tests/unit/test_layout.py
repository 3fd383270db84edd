"""docs/DESIGN.md's Layout is the code's: its tree names every module and package of cli/, node/ and
swarm/, each in its folder, and nothing that is not there. A unit test (fast)."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.repo import ROOT

LAYERS = ("cli", "node", "swarm")


def layout_tree(design: str) -> set[str]:
    """The paths the Layout's tree names: its indented block (4 spaces, then 2 more per level), a
    name ending in / a folder, in .py a module."""
    section = design.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if re.match(r"^    \S", line) or re.match(r"^      +\S", line)]
    block = []
    for line in lines:  # the tree: the first indented block that opens on a layer
        if not block and not line.strip().startswith(tuple(f"{layer}/" for layer in LAYERS)):
            continue
        block.append(line)
    paths, stack = set(), []
    for line in block:
        if not line.strip():
            break
        depth = (len(line) - len(line.lstrip()) - 4) // 2
        name = line.split()[0]
        if not (name.endswith("/") or name.endswith(".py")):
            break  # past the tree (the seam's table, say)
        stack = stack[:depth] + [name.rstrip("/")]
        paths.add("/".join(stack) + ("/" if name.endswith("/") else ""))
    return paths


def code_tree(root: Path = ROOT) -> set[str]:
    """Every package (a folder with an __init__.py) and module (but __init__.py) of the layers."""
    out = set()
    for layer in LAYERS:
        for path in (root / layer).rglob("*.py"):
            rel = path.relative_to(root)
            if path.name == "__init__.py":
                out.add(rel.parent.as_posix() + "/")
            else:
                out.add(rel.as_posix())
    return out


def test_the_design_layout_names_every_module_and_nothing_else():
    named = layout_tree((ROOT / "docs" / "DESIGN.md").read_text())
    code = code_tree()
    assert not code - named, f"modules the Layout does not name: {sorted(code - named)}"
    assert not named - code, f"the Layout names what the code does not have: {sorted(named - code)}"


def test_the_tree_reader_places_each_name_in_its_folder():
    design = ("# x\n\n## Layout\n\nProse.\n\n    cli/          the app\n      roles/      roles\n        a.py      one\n"
              "      b.py        two\n    node/         n\n      c.py        three\n\n**The seam**\n\n## Next\n")
    assert layout_tree(design) == {"cli/", "cli/roles/", "cli/roles/a.py", "cli/b.py", "node/", "node/c.py"}
