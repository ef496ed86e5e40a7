"""The package's layout is a rule: imports point one way, and nothing imports in a circle.

Every ``import`` in ``pgnb/`` counts, including those inside functions and under
``TYPE_CHECKING`` (an import hidden in a function is still a dependency). The
directions (docs/architecture.md):

    notebook -> core -> {rank, procs, _wire, errors, spec}
    rank -> _wire        procs -> _wire        spec -> errors

Also: an engine that runs pgnb's rank code loads nothing of the kernel side
(checked on a real world).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "pgnb"

#: layer -> the pgnb layers it may import (itself always allowed)
ALLOWED = {
    "pgnb": {"notebook", "core", "rank", "procs", "_wire", "errors", "spec"},  # __init__, __main__: the top
    "notebook": {"core", "rank", "procs", "_wire", "errors", "spec"},
    "core": {"rank", "procs", "_wire", "errors", "spec"},
    "rank": {"_wire"},
    "procs": {"_wire"},
    "spec": {"errors"},
    "errors": set(),
    "_wire": set(),
}
#: Third-party packages a layer may not import: the kernel side stays free of the notebook's UI.
FORBIDDEN_THIRD_PARTY = {
    "core": ("ipywidgets", "IPython.core.magic", "IPython.display", "matplotlib.pyplot"),
    "rank": ("ipywidgets", "IPython.core.magic"),
    "procs": ("ipywidgets", "IPython", "torch"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__init__", "__main__"):
        return "pgnb"
    return parts[1]


def imports(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (absolute names), anywhere in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, node.lineno))
            # `from . import x` / `from .core import sandbox` may name submodules
            for a in node.names:
                candidate = f"{target}.{a.name}"
                if (PKG.parent / (candidate.replace(".", "/") + ".py")).exists() or (
                        PKG.parent / candidate.replace(".", "/") / "__init__.py").exists():
                    out.append((candidate, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        me = module_name(path)
        edges[me] = {m for m, _ in imports(path) if m.split(".")[0] == "pgnb" and m != me}
    return edges


def test_every_import_points_down():
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        me = module_name(path)
        for target, line in imports(path):
            if target.split(".")[0] != "pgnb" or target == "pgnb":
                if target == "pgnb" and layer(me) != "pgnb":
                    wrong.append(f"{me}:{line} imports the package top (pgnb) itself")
                continue
            to = layer(target)
            if to != layer(me) and to not in ALLOWED[layer(me)]:
                wrong.append(f"{me}:{line} imports {target} ({layer(me)} -> {to})")
    assert wrong == []


def test_layers_keep_out_of_the_ui():
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        me = module_name(path)
        for target, line in imports(path):
            for banned in FORBIDDEN_THIRD_PARTY.get(layer(me), ()):
                if target == banned or target.startswith(banned + "."):
                    wrong.append(f"{me}:{line} imports {target}")
    assert wrong == []


def test_no_import_cycles():
    edges = graph()
    # the package __init__ of each module runs first, but that is Python's order, not a dependency:
    # only the modules' own imports count
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if n not in edges:
                continue
            if state.get(n) == 1:
                cycles.append(" -> ".join([*stack[stack.index(n):], n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert cycles == []


def test_the_checker_sees_a_hidden_cycle(tmp_path, monkeypatch):
    """The checks above can fail: a cycle through an import inside a function is found."""
    pkg = tmp_path / "pgnb"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from . import b\n")
    (pkg / "core" / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "rank").mkdir()
    (pkg / "rank" / "__init__.py").write_text("")
    (pkg / "rank" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..core import a\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    with pytest.raises(AssertionError):
        test_no_import_cycles()
    with pytest.raises(AssertionError):
        test_every_import_points_down()


@pytest.mark.integration
def test_a_rank_loads_no_kernel_side_module():
    """After init, a cell, a trace and a show, an engine has imported pgnb.rank only (a fresh world:
    functions other tests send by reference would import their own modules there)."""
    import pgnb
    from pgnb.core.show import gather

    with pgnb.Sandbox(world=2) as sb:
        sb.execute("x = torch.ones(2)", trace=True)
        gather("x", world=sb)
        res = sb.execute("import sys\nsorted(m for m in sys.modules if m == 'pgnb' or m.startswith('pgnb.'))")
    for mods in res.values:
        assert {"pgnb.rank.engine", "pgnb.rank.cell", "pgnb.rank.trace", "pgnb.rank.values"} <= set(mods)
        assert [m for m in mods if m.startswith(("pgnb.core", "pgnb.notebook"))] == []
