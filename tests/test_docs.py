"""The reference pages say what the tree has: every module in docs/architecture.md, the Makefile's
commands in docs/reliability.md, every magic in ``PgMagics``' docstring (no engines)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "pgnb"
DOCS = ROOT / "docs"


def documented_modules() -> set[str]:
    """The paths (``pgnb/core/world.py``) the package tree of docs/architecture.md names."""
    text = (DOCS / "architecture.md").read_text()
    tree = text.split("## The package", 1)[1].split("```", 2)[1]
    found: set[str] = set()
    folder = ""
    for line in tree.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m or m[2] == "pgnb/":
            continue
        indent, name = len(m[1]), m[2]
        if indent == 2 and name.endswith("/"):
            folder = name
        elif indent == 2 and "." in name:
            folder, found = "", found | {f"pgnb/{name}"}
        elif indent == 4 and folder and "." in name:
            found.add(f"pgnb/{folder}{name}")
    return found


def test_architecture_lists_every_module():
    on_disk = {str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent == PKG}
    on_disk |= {str(p.relative_to(ROOT)) for p in [*PKG.glob("*.cfg"), *PKG.glob("py.typed")]}  # package data
    named = documented_modules()
    assert not on_disk - named, f"modules docs/architecture.md does not list: {sorted(on_disk - named)}"
    assert not named - on_disk, f"docs/architecture.md lists modules that are gone: {sorted(named - on_disk)}"


def _recipe(target: str) -> list[str]:
    """The lines of a Makefile target's recipe."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{target}:"))
    out = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        out.append(ln.strip())
    return out


def test_reliability_page_gives_make_soaks_commands():
    """Each pytest command of ``make soak`` stands in docs/reliability.md as it runs."""
    page = " ".join((DOCS / "reliability.md").read_text().split())
    commands = [ln.split("$(PY) -m ", 1)[1] for ln in _recipe("soak") if "$(PY) -m pytest" in ln]
    assert commands
    for cmd in commands:
        assert f"`{cmd}`" in page, f"docs/reliability.md does not give make soak's `{cmd}`"


def test_pgmagics_docstring_lists_every_magic():
    from pgnb.notebook.magics import PgMagics

    doc = PgMagics.__doc__ or ""
    names = [f"%{n}" for n in PgMagics.magics["line"]] + [f"%%{n}" for n in PgMagics.magics["cell"]]
    missing = [n for n in names if not re.search(re.escape(n) + r"\b", doc)]
    assert not missing, f"PgMagics' docstring does not name {missing}"


def test_sandbox_public_surface_is_what_cells_md_documents():
    """Every public member of ``pgnb.Sandbox`` has its row in docs/cells.md's table, and no row names a gone one."""
    import pgnb

    page = (DOCS / "cells.md").read_text().split("## `pgnb.Sandbox`, in full", 1)[1]
    documented = set(re.findall(r"`sb\.([a-z_]+)", page))
    public = {n for n in dir(pgnb.Sandbox) if not n.startswith("_")}
    assert public - documented == set(), f"public on Sandbox, not in docs/cells.md: {sorted(public - documented)}"
    assert documented - public == set(), f"in docs/cells.md, not on Sandbox: {sorted(documented - public)}"
