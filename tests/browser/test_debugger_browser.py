"""JupyterLab's Debugger panel on the ranks of a ``%%pg`` cell, clicked through as a user does (issue 32).

One notebook, run from the UI in headless Chromium: the bug button on, then
``%pg_init`` (its processes start outside the kernel's debugger), then

* a plain cell: a click in the gutter sets a breakpoint, Run stops on it, the
  Variables panel shows ``x``, Continue, the cell prints (ipykernel's own
  debugging, with pgnb loaded);
* a ``%%pg`` cell: a click in the gutter on its line 4, Run; the Call Stack shows
  both ranks' frames (each named ``rank N: ...``); clicking rank 0's frame shows
  rank 0's ``x`` in Variables, clicking rank 1's shows rank 1's; Continue runs the
  rank shown (rank 1) into its ``all_reduce``, where it waits: the panel then
  shows rank 0 stopped beside rank 1 blocked, with its stack (the screenshot);
  Continue again, and the cell's grouped output appears;
* ``%pg_shutdown`` leaves nothing.

Read from the panel's DOM (``.jp-DebuggerCallstackFrame``, ``.jp-DebuggerVariables``).
Screenshot (ARTIFACTS_DIR): debugger_panel.png; with PGNB_UPDATE_SCREENSHOT=1
also docs/debugger_panel.png.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import controller_errors

pytestmark = pytest.mark.browser

REPO_ROOT = Path(__file__).resolve().parents[2]
INIT_TIMEOUT_MS = 180_000
STOP_TIMEOUT_MS = 30_000

LOAD, INIT, PLAIN, PG, SHUTDOWN = range(5)
CELLS = [
    "%load_ext pgnb",
    "%pg_init --backend gloo --world 2",
    "x = 41\ny = x + 1\nprint(y)",
    "%%pg\nimport torch, torch.distributed as dist\nx = 40 + rank\ntotal = torch.tensor([x])\n"
    "dist.all_reduce(total)\nprint(x, int(total))",
    "%pg_shutdown",
]
PLAIN_LINE = 2  # y = x + 1
PG_LINE = 4  # total = torch.tensor([x]), the %%pg line counted as line 1
GROUPED = re.compile(r"\[rank 0\]\s*40 81\s*\[rank 1\]\s*41 81")

#: The Variables panel's tree: name -> shown value
VARIABLES_JS = """() => Object.fromEntries([...document.querySelectorAll('.jp-DebuggerVariables jp-tree-item')]
  .map(item => [item.querySelector(':scope > .jp-DebuggerVariables-name'),
                item.querySelector(':scope > .jp-DebuggerVariables-detail')])
  .filter(([n, d]) => n && d).map(([n, d]) => [n.innerText.trim(), d.innerText.trim()]))"""


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _variables(page: Any) -> dict[str, str]:
    return dict(page.evaluate(VARIABLES_JS))


def _wait_variable(page: Any, name: str, value: str, timeout_ms: int = STOP_TIMEOUT_MS) -> None:
    page.wait_for_function(f"() => ({VARIABLES_JS})()[{name!r}] === {value!r}", timeout=timeout_ms)


def _frames(page: Any) -> list[str]:
    return [t.strip() for t in page.locator(".jp-DebuggerCallstackFrame").all_inner_texts()]


def _frame(page: Any, prefix: str) -> Any:
    """The Call Stack's first frame whose name starts with ``prefix``."""
    return page.locator(".jp-DebuggerCallstackFrame").filter(
        has=page.locator(".jp-DebuggerCallstackFrame-name", has_text=re.compile("^" + re.escape(prefix)))).first


def _toggle_breakpoint(nb: Any, cell: int, line: int, count: int) -> None:
    """Click the breakpoint gutter of ``cell`` beside ``line`` (its first element is CodeMirror's hidden spacer);
    the Breakpoints panel then lists ``count``."""
    gutter = nb.cell(cell).locator(".cm-breakpoint-gutter .cm-gutterElement")
    gutter.nth(line).click()
    _expect()(nb.page.locator(".jp-DebuggerBreakpoint")).to_have_count(count, timeout=10_000)


def _continue(page: Any) -> None:
    page.locator(".jp-DebuggerSidebar [title^='Continue']").first.click()


def _screenshot(nb: Any, artifacts: Path) -> None:
    """The notebook beside the Debugger panel: the file browser folded away, Kernel Sources collapsed, the
    ``%%pg`` cell and its live view in sight."""
    page = nb.page
    page.locator(".lm-TabBar-tab[data-id='filebrowser']").click()  # the open left panel folds away
    for title in ("Breakpoints", "Kernel Sources"):
        page.locator(".jp-DebuggerSidebar .lm-AccordionPanel-titleLabel", has_text=title).click()
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
    box = handle.bounding_box()
    if box is not None:  # the panel wide enough for a frame's name
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] - 220, box["y"] + box["height"] / 2, steps=5)
        page.mouse.up()
    split = page.locator(".jp-DebuggerSidebar .lm-SplitPanel-handle:not(.lm-mod-hidden)").first
    box = split.bounding_box()
    if box is not None:  # Variables tall enough for the cell's names
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 170, steps=5)
        page.mouse.up()
    nb.cell(PG).evaluate("cell => cell.scrollIntoView({block: 'center'})")
    page.wait_for_timeout(500)  # let the layout settle
    page.screenshot(path=str(artifacts / "debugger_panel.png"))
    if os.environ.get("PGNB_UPDATE_SCREENSHOT") == "1":
        page.screenshot(path=str(REPO_ROOT / "docs" / "debugger_panel.png"))


def test_breakpoints_in_the_gutter_stop_the_ranks_and_the_panel_shows_each(
    open_notebook: Any, lab_server: Any, artifacts: Path, pgnb_leftovers: Any
) -> None:
    expect = _expect()
    nb = open_notebook("debugger.ipynb", CELLS)
    page = nb.page
    nb.run(LOAD)
    page.locator(".jp-DebuggerBugButton[aria-pressed='false']:not([disabled])").click()
    expect(page.locator(".jp-DebuggerBugButton[aria-pressed='true']")).to_have_count(1, timeout=10_000)
    nb.run(INIT, timeout_ms=INIT_TIMEOUT_MS)
    assert not nb.error_outputs(INIT)

    # a plain cell: ipykernel's own debugging, with pgnb loaded
    _toggle_breakpoint(nb, PLAIN, PLAIN_LINE, 1)
    nb.run(PLAIN, wait=False)
    _wait_variable(page, "x", "41")
    assert "y" not in _variables(page)
    expect(page.locator(".jp-DebuggerCallstackFrame").first).to_contain_text(f":{PLAIN_LINE}", timeout=10_000)
    _continue(page)
    nb.wait_done(PLAIN)
    expect(nb.output(PLAIN)).to_have_text(re.compile(r"^\s*42\s*$"), timeout=10_000)
    _toggle_breakpoint(nb, PLAIN, PLAIN_LINE, 0)

    # a %%pg cell: both ranks stop on line 4; the Call Stack holds each rank's frames
    _toggle_breakpoint(nb, PG, PG_LINE, 1)
    nb.run(PG, wait=False)
    expect(_frame(page, "rank 0: ")).to_be_visible(timeout=STOP_TIMEOUT_MS)
    expect(_frame(page, "rank 1: ")).to_be_visible(timeout=STOP_TIMEOUT_MS)
    _frame(page, "rank 0: ").click()
    _wait_variable(page, "x", "40")
    assert "total" not in _variables(page)  # stopped before line 4 ran
    expect(_frame(page, "rank 0: ")).to_contain_text(f":{PG_LINE}")
    _frame(page, "rank 1: ").click()
    _wait_variable(page, "x", "41")

    # Continue acts on the rank shown: rank 1 runs into all_reduce and waits there for rank 0
    _continue(page)
    blocked = _frame(page, "rank 1: running, waiting in all_reduce")
    expect(blocked).to_be_visible(timeout=STOP_TIMEOUT_MS)
    expect(page.locator(".jp-DebuggerCallstackFrame").first).to_contain_text("rank 0: ")
    _wait_variable(page, "x", "40")
    print("call stack, rank 0 stopped beside rank 1 blocked:", _frames(page))
    _screenshot(nb, artifacts)

    _continue(page)
    nb.wait_done(PG)
    expect(nb.output(PG)).to_have_text(GROUPED, timeout=10_000)
    assert not nb.error_outputs(PG)
    _toggle_breakpoint(nb, PG, PG_LINE, 0)

    nb.run(SHUTDOWN)
    assert not nb.error_outputs(SHUTDOWN)
    assert not pgnb_leftovers(15.0)
    assert not controller_errors(lab_server), controller_errors(lab_server)
    assert not nb.traffic.page_errors, nb.traffic.page_errors
