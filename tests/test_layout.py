"""The package's layout is a rule: imports point one way, and nothing imports in a circle.

Every ``import`` in ``pgnb/`` counts, including those inside functions and under
``TYPE_CHECKING`` (an import hidden in a function is still a dependency). The
directions (docs/architecture.md):

    notebook -> agent -> core -> {rank, procs, _wire, errors, spec}
    rank -> _wire        procs -> _wire        spec -> errors
    every layer -> _private_names (stdlib only, like _wire)

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
    "pgnb": {"notebook", "agent", "debugger", "core", "rank", "procs", "_wire", "_private_names", "errors",
             "spec"},  # __init__, __main__
    "notebook": {"agent", "core", "rank", "procs", "_wire", "_private_names", "errors",
                 "spec"},  # agent: %pg_mcp serves its tools
    "agent": {"core", "rank", "procs", "_wire", "_private_names", "errors",
              "spec"},  # the MCP tools (pgnb mcp, %pg_mcp)
    "testing": {"core", "rank", "spec", "errors", "_wire", "_private_names"},  # the pytest plugin; nothing imports it
    "debugger": {"core", "rank", "spec", "errors", "_wire",
                 "_private_names"},  # JupyterLab's Debugger panel; pgnb's top installs it
    "core": {"rank", "procs", "_wire", "_private_names", "errors", "spec"},
    "rank": {"_wire", "_private_names"},
    "procs": {"_wire", "_private_names"},
    "spec": {"errors"},
    "errors": set(),
    "_wire": set(),
    # stdlib only: every private name of torch's, ipyparallel's, ... that pgnb uses, for both sides
    "_private_names": set(),
}
#: Third-party packages a layer may not import: the kernel side stays free of the notebook's UI.
FORBIDDEN_THIRD_PARTY = {
    "core": ("ipywidgets", "IPython.core.magic", "IPython.display", "matplotlib.pyplot"),
    "agent": ("ipywidgets", "IPython"),
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
def test_a_rank_loads_no_kernel_side_module(make_world):
    """After init, a cell, a trace and a show, an engine has imported pgnb.rank only (a fresh world:
    functions other tests send by reference would import their own modules there)."""
    from pgnb.core.show import gather

    sb = make_world(world=2)
    sb.execute("x = torch.ones(2)", trace=True)
    gather("x", world=sb)
    res = sb.execute("import sys\nsorted(m for m in sys.modules if m == 'pgnb' or m.startswith('pgnb.'))")
    for mods in res.values:
        assert {"pgnb.rank.engine", "pgnb.rank.cell", "pgnb.rank.trace", "pgnb.rank.values"} <= set(mods)
        assert [m for m in mods if m.startswith(("pgnb.core", "pgnb.notebook"))] == []


# ---- one fact in one place: the zombie check and the rule for a remote failure ---------------------------------
TESTS = PKG.parent / "tests"
#: The one module that reads ``/proc/PID/stat`` and says whether a process is a zombie (pgnb's process helpers).
PROCESS_FACTS = "pgnb/procs/processes.py"
#: The one module that reads a remote exception's name and decides what a failed task means.
REMOTE_RULE = "pgnb/core/remote.py"
#: The names ipyparallel gives a task whose engine died and one aborted behind an interrupted one.
REMOTE_FAILURES = {"EngineError", "TaskAborted"}
#: A zombie's state letter in ``/proc/PID/stat``.
ZOMBIE_STATE = {"Z"}


def _text(node: ast.AST) -> str | None:
    """A string literal's text (an f-string's placeholders as ``{}``), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) or "" if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _copies(path: Path) -> list[str]:
    """Where ``path`` reads ``/proc/PID/stat``, checks for a zombie, or compares a remote exception's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            text = _text(node) or ""
            if text.startswith("/proc/") and text.endswith("/stat"):
                found.append(f"{line}: reads /proc/PID/stat")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _text(node.right) == "stat":
            found.append(f"{line}: reads /proc/PID/stat")  # Path("/proc") / pid / "stat"
        if isinstance(node, ast.Attribute) and node.attr == "STATUS_ZOMBIE":
            found.append(f"{line}: checks for a zombie (psutil.STATUS_ZOMBIE)")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            values = {_text(e) for s in sides for e in (s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set))
                                                        else [s])}
            if values & ZOMBIE_STATE:
                found.append(f"{line}: checks for a zombie (state Z)")
            if values & REMOTE_FAILURES:
                found.append(f"{line}: compares a remote exception's name with {sorted(values & REMOTE_FAILURES)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and _text(node.args[1]) == "ename"):
            found.append(f"{line}: reads a remote exception's name (getattr ename)")
    return sorted(found, key=lambda c: int(c.split(":", 1)[0]))


def _copies_in(root: Path, allowed: dict[str, set[str]]) -> list[str]:
    """Every copy below ``root`` outside the modules ``allowed`` to hold it (by what the copy is)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(PKG.parent))
        for copy in _copies(path):
            if not any(rel == module and any(word in copy for word in words) for module, words in allowed.items()):
                out.append(f"{rel}:{copy}")
    return out


def test_one_zombie_check_and_one_rule_for_a_remote_failure_in_the_package():
    """Only the process helpers read ``/proc/PID/stat`` or decide what a zombie is; only ``core/remote.py``
    reads a remote exception's name (``ename``) and compares it with EngineError or TaskAborted."""
    allowed = {PROCESS_FACTS: {"reads /proc", "zombie"}, REMOTE_RULE: {"remote exception"}}
    assert _copies_in(PKG, allowed) == []


def test_the_tests_use_the_same_zombie_check():
    """The tests ask pgnb's process helpers too (conftest's ``alive`` and ``wait_gone`` are built on them)."""
    assert _copies_in(TESTS, {}) == []


def test_the_copy_finder_sees_each_kind_of_copy(tmp_path):
    """The two tests above can fail: each way of writing a copy is found."""
    src = tmp_path / "copies.py"
    src.write_text(
        "import psutil\nfrom pathlib import Path\n"
        "def a(pid):\n    return open(f'/proc/{pid}/stat').read().split()[2] == 'Z'\n"
        "def b(entry):\n    return (Path('/proc') / entry / 'stat').read_text()\n"
        "def c(p):\n    return p.status() == psutil.STATUS_ZOMBIE\n"
        "def d(e):\n    return getattr(e, 'ename', None) in ('EngineError', 'TaskAborted')\n"
        "def e(r):\n    return r.ename == 'EngineError'\n"
    )
    assert [c.split(": ", 1)[0] for c in _copies(src)] == ["4", "4", "6", "8", "10", "10", "12"]


#: Sizes a reader can hold in their head (the house's second pass): the world's lifecycle module, and any class.
WORLD_LINES = 550
CLASS_LINES = 450


def test_the_world_and_every_class_stay_small():
    world = PKG / "core" / "world.py"
    assert len(world.read_text().splitlines()) <= WORLD_LINES, f"{world} is over {WORLD_LINES} lines: carve it"
    big = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > CLASS_LINES:
                big.append(f"{path.relative_to(PKG.parent)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not big, f"classes over {CLASS_LINES} lines: {big}"
