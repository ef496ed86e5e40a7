"""The lessons' stored outputs replay on other machines and torch versions as far as they can.

No stored output in ``notebooks/`` may carry a source line number of torch (or of any other
library): they change with every release. Where a stored output quotes torch's own words (an
error message, a library frame), docs/testing_notebooks.md must list it under "The torch the
lessons are recorded with", so a reader knows what another torch may print differently. No
engines, no kernel: this reads the stored notebooks only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOC = ROOT / "docs" / "testing_notebooks.md"
SECTION = "### The torch the lessons are recorded with"

#: A library's source line number: Python's own frame text, or ``file.py:123`` / ``pair.cc:553``.
#: The cell's own lines ("Cell, line 4", "Earlier cell, line 3") are the user's, and stay.
LINE_NUMBER = re.compile(r'File "[^"]*", line \d+|\.(?:py|pyx|c|cc|cpp|cu|h|hpp)(?:"?, line |:)\d+')
#: A library frame as pgnb shows it in tracebacks and stacks: ``  torch/distributed/x.py, in f``.
TORCH_FRAME = re.compile(r"^\s*(torch/\S+\.py, in \S+)\s*$", re.M)
#: An exception quoted with its message: ``ValueError: Default process group ...``; also one quoted
#: inside another (pgnb's ``UsageError: rank 0 raised DistStoreError: ...; rank 1 raised ...``).
ERROR_LINE = re.compile(r"(?=\b([A-Z]\w*(?:Error|Exception|Warning)): ([^\n;]*))")
#: pgnb's own lines that look like a quoted exception (results.py stands in for gloo's varying wording).
PGNB_OWN = ("lost peer",)


def stored_outputs(path: Path) -> list[tuple[int, str]]:
    """(cell index, text) for everything stored in the code cells' outputs, images aside."""
    nb = nbformat.read(str(path), as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if o["output_type"] == "stream":
                out.append((i, o["text"]))
            elif o["output_type"] == "error":
                out.append((i, "\n".join([f"{o['ename']}: {o['evalue']}", *o.get("traceback", [])])))
            else:
                out.extend((i, v) for k, v in o.get("data", {}).items()
                           if isinstance(v, str) and not k.startswith("image/"))
    return out


def pinned() -> tuple[str, list[str]]:
    """The torch version the docs say the lessons are recorded with, and the torch words they list."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC.name} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    version = re.search(r"recorded with torch (\d+\.\d+\.\d+)", section)
    assert version, "the section does not say which torch the lessons are recorded with"
    quotes = re.findall(r"^- `([^`]+)`", section, re.M)
    assert quotes, "the section lists no quoted torch words"
    return version[1], quotes


def all_outputs() -> list[tuple[str, int, str]]:
    return [(p.stem, i, t) for p in NOTEBOOKS for i, t in stored_outputs(p)]


def test_the_patterns_catch_what_they_are_for():
    for bad in ('  File "torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
                "blocked in all_reduce (distributed_c10d.py:3252); run ...",
                "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed",
                "  torch/distributed/rendezvous.py, line 12, in _env_rendezvous_handler"):
        assert LINE_NUMBER.search(bad), bad
    for good in ("  Cell, line 4", "  Earlier cell, line 3, in helper", "blocked in the cell, line 3",
                 "  torch/distributed/distributed_c10d.py, in all_reduce",
                 "blocked in all_reduce (distributed_c10d.py); run ...", "SyntaxError: invalid syntax (line 2)"):
        assert not LINE_NUMBER.search(good), good
    assert TORCH_FRAME.findall("x\n  torch/distributed/c10d_logger.py, in wrapper\n") == [
        "torch/distributed/c10d_logger.py, in wrapper"]
    assert ERROR_LINE.findall("UsageError: rank 0 raised DistStoreError: Timed out after 4 seconds; rank 1 ...") == [
        ("UsageError", "rank 0 raised DistStoreError: Timed out after 4 seconds"),
        ("DistStoreError", "Timed out after 4 seconds")]


def test_there_are_stored_outputs_to_check():
    assert len(NOTEBOOKS) >= 7
    assert all(stored_outputs(p) for p in NOTEBOOKS), "a notebook has no stored outputs: refresh it"


def own_files(path: Path) -> set[str]:
    """The ``.py`` files a lesson writes itself (its cells name them): their lines are the lesson's own, and
    pgnb shows a user's file with its line numbers (lesson 21's test files)."""
    cells = json.loads(path.read_text())["cells"]
    return {name for c in cells if c["cell_type"] == "code"
            for name in re.findall(r"\b([\w]+\.py)\b", "".join(c["source"]))}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_library_line_numbers_in_stored_outputs(path):
    own = own_files(path)
    found = [(i, m.group(0), text[max(0, m.start() - 60): m.end() + 20])
             for i, text in stored_outputs(path) for m in LINE_NUMBER.finditer(text)
             if not (m.group(0).startswith('File "') and m.group(0).split('"')[1] in own)]
    assert not found, "source line numbers in stored outputs (cell index, match, context):\n" + "\n".join(
        f"  c{i}: {match!r} in ...{context!r}..." for i, match, context in found)


def test_docs_name_the_torch_that_make_installs():
    """One fact: the torch the lessons are recorded with is the one `make` installs by default."""
    version, _ = pinned()
    spec = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert spec, "Makefile has no default TORCH_SPEC"
    assert spec[1] == version, f"Makefile installs torch {spec[1]}; {DOC.name} says the lessons use {version}"


def test_every_quote_of_torch_is_listed_in_the_docs():
    _, quotes = pinned()
    outputs = all_outputs()
    unlisted = set()
    for stem, i, text in outputs:
        for frame in TORCH_FRAME.findall(text):
            if frame not in quotes:
                unlisted.add(f"{stem} c{i}: frame {frame!r}")
        for ename, message in ERROR_LINE.findall(text):
            if ename == "UsageError" or any(own in message for own in PGNB_OWN):
                continue  # pgnb's own one-line errors and fixed lines
            if not any(q in message for q in quotes):  # a listed type alone does not cover its message
                unlisted.add(f"{stem} c{i}: {ename}: {message!r}")
    assert not unlisted, (f"stored outputs quote torch in places {DOC.name} does not list under {SECTION!r}; "
                          "list them, or print the lesson's own words instead:\n" + "\n".join(sorted(unlisted)))


def test_every_listed_quote_still_occurs():
    _, quotes = pinned()
    texts = [t for _, _, t in all_outputs()]
    gone = [q for q in quotes if not any(q in t for t in texts)]
    assert not gone, f"{DOC.name} lists torch words no stored output has any more: {gone}"
