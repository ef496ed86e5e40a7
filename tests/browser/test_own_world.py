"""Every status view tells the truth about its own world, in a notebook with many ``%pg_init``s (issue 18).

Run from the UI, read from the DOM (widget elements, never the text/plain
fallback, reference pitfall 9):

* five ``%pg_init`` cells (env, tcp, file, ``--world 3``, ``--world 2`` env)
  in JupyterLab and in Notebook 7: each cell's output names only its own
  world (init method, world size, rows), the first cell still shows a table
  of its rank rows, only the newest view is live, and after ``%pg_shutdown``
  no view claims another world;
* notebook 01 run cell by cell in JupyterLab, then ``%pg_shutdown``: the same,
  and the notebook as JupyterLab saves it replays under strict nbval;
* no ``[IPController] ERROR`` line in the server's log or the controllers' logs.

Screenshots (ARTIFACTS_DIR): own_world_{lab,notebook}.png; with
PGNB_UPDATE_SCREENSHOT=1 also docs/status_view_lab.png and
docs/status_view_notebook7.png.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .conftest import controller_errors, notebook7_available

pytestmark = pytest.mark.browser

REPO_ROOT = Path(__file__).resolve().parents[2]
VIEW = ".jupyter-widgets.pgnb-view"
UI_TIMEOUT_MS = 60_000
INIT_TIMEOUT_MS = 180_000

#: cell -> (init scheme, world size) of the world that cell made
WORLDS = {1: ("env", 2), 2: ("tcp", 2), 3: ("file", 2), 4: ("env", 3), 5: ("env", 2)}
CELLS = [
    "%load_ext pgnb",
    "%pg_init --backend gloo --world 2 --init-method env",
    "%pg_init --backend gloo --world 2 --init-method tcp",
    "%pg_init --backend gloo --world 2 --init-method file",
    "%pg_init --backend gloo --world 3",
    "%pg_init --backend gloo --world 2 --init-method env",
    "%pg_shutdown",
]
SHUTDOWN = len(CELLS) - 1


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _run_clean(nb: Any, cell: int, timeout_ms: int = INIT_TIMEOUT_MS) -> None:
    nb.run(cell, timeout_ms=timeout_ms)
    errors = nb.error_outputs(cell)
    assert not errors, f"cell {cell} wrote stderr/traceback: {errors}"


def _view(nb: Any, cell: int) -> Any:
    view = nb.output(cell).locator(VIEW)
    _expect()(view).to_have_count(1, timeout=15_000)
    return view


def claims(text: str) -> dict[str, set[str]]:
    """The worlds a piece of output text names: init schemes, world sizes, and N of "k/N initialized"."""
    return {
        "init": set(re.findall(r"\binit (\w+)://", text)),
        "world": set(re.findall(r"\bworld (\d+)\b", text)),
        "count": set(re.findall(r"\b\d+/(\d+) initialized\b", text)),
    }


def check_own_world(nb: Any, cell: int, scheme: str, size: int, frozen: str | None) -> dict[str, Any]:
    """Cell ``cell``'s output names only its own world; its view has one row per rank; ``frozen``: its one line."""
    expect = _expect()
    view = _view(nb, cell)
    rows = view.locator(".pgnb-row")
    expect(rows).to_have_count(size, timeout=10_000)
    expect(rows.first).to_be_visible()
    text = nb.output(cell).inner_text()
    seen = claims(text)
    assert seen["init"] == {scheme} and seen["world"] == {str(size)} and seen["count"] <= {str(size)}, (
        f"cell {cell} ({CELLS[cell]!r}) names another world: {seen} in {text!r}")
    # each row's world column is the cell's own world size (the column is 3.5em wide, see view._WIDTHS)
    worlds = rows.locator("span[style*='width:3.5em']").all_inner_texts()
    assert worlds == [str(size)] * size, (cell, worlds)
    note = view.locator(".pgnb-frozen")
    if frozen is None:
        expect(note).to_have_count(0)
        expect(view.locator(".jupyter-widgets.pgnb-refresh")).to_have_count(1)
    else:
        expect(note).to_have_text(f"frozen: {frozen}", timeout=10_000)
        expect(view.locator("button.pgnb-refresh[disabled]")).to_have_count(1)
        expect(view.locator("button.pgnb-shutdown[disabled]")).to_have_count(1)
    return {"cell": cell, "rows": size, "claims": {k: sorted(v) for k, v in seen.items()}, "frozen": frozen}


def _screenshot(nb: Any, artifacts: Path, name: str, docs_name: str, first: int, last: int) -> None:
    """Cells ``first``..``last`` in one picture: the viewport is made tall enough for all of them first."""
    page = nb.page
    size = page.viewport_size
    tall = page.evaluate("() => Math.max(...[...document.querySelectorAll('.jp-Notebook, .jp-WindowedPanel-outer')]"
                         ".map(e => e.scrollHeight))")
    page.set_viewport_size({"width": size["width"], "height": min(int(tall) + 200, 6000)})
    try:
        page.evaluate("() => document.querySelectorAll('.jp-WindowedPanel-outer, .jp-Notebook')"
                      ".forEach(e => { e.scrollTop = 0; })")
        page.wait_for_timeout(500)  # let the layout settle
        top, bottom = nb.cell(first).bounding_box(), nb.cell(last).bounding_box()
        clip = {"x": top["x"], "y": top["y"], "width": top["width"],
                "height": bottom["y"] + bottom["height"] - top["y"]}
        page.screenshot(path=str(artifacts / name), clip=clip)
        if os.environ.get("PGNB_UPDATE_SCREENSHOT") == "1":
            page.screenshot(path=str(REPO_ROOT / "docs" / docs_name), clip=clip)
    finally:
        page.set_viewport_size(size)


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_five_inits_each_view_shows_its_own_world(
    ui: str, open_notebook: Any, lab_server: Any, artifacts: Path, pgnb_leftovers: Any
) -> None:
    if ui == "notebook" and not notebook7_available():
        pytest.skip("Notebook 7 is not installed (pip install 'notebook>=7')")
    nb = open_notebook(f"own_world_{ui}.ipynb", CELLS, ui=ui)
    # Notebook 7 reports two errors of its own while it loads (a settings schema, the file
    # browser's open-path command): the check below is on what happens after that
    loading_errors = len(nb.traffic.page_errors)
    _run_clean(nb, 0)
    for cell in WORLDS:
        _run_clean(nb, cell)
    found = []
    for cell, (scheme, size) in WORLDS.items():
        newest = cell == max(WORLDS)
        found.append(check_own_world(nb, cell, scheme, size, None if newest else "replaced by a later %pg_init"))
    _screenshot(nb, artifacts, f"own_world_{ui}.png", f"status_view_{'lab' if ui == 'lab' else 'notebook7'}.png",
                min(WORLDS), max(WORLDS))

    _run_clean(nb, SHUTDOWN, timeout_ms=UI_TIMEOUT_MS)
    for cell, (scheme, size) in WORLDS.items():
        newest = cell == max(WORLDS)
        check_own_world(nb, cell, scheme, size, "shut down" if newest else "replaced by a later %pg_init")
    newest_states = _view(nb, max(WORLDS)).locator(".pgnb-state").all_inner_texts()
    assert newest_states == ["destroyed"] * WORLDS[max(WORLDS)][1], newest_states
    (artifacts / f"own_world_{ui}.json").write_text(json.dumps(found, indent=1))
    assert not pgnb_leftovers(15.0)
    assert not controller_errors(lab_server), controller_errors(lab_server)
    assert not nb.traffic.page_errors[loading_errors:], nb.traffic.page_errors


LESSON_01 = REPO_ROOT / "notebooks" / "01_init_process_group.ipynb"


def _lesson_views(cells: list[dict[str, Any]]) -> dict[int, tuple[str, int, str]]:
    """Cells with a status view -> (init scheme, world size, the line it shows once frozen)."""
    views: dict[int, tuple[str, int, str]] = {}
    world = None
    for i, c in enumerate(cells):
        src = "".join(c["source"]) if c["cell_type"] == "code" else ""
        m = re.match(r"%pg_init\b(.*)", src)
        if m:
            scheme = re.search(r"--init-method (\w+)", m.group(1))
            size = re.search(r"--world (\d+)", m.group(1))
            new = (scheme.group(1) if scheme else "env", int(size.group(1)) if size else 2)
            why = "replaced by a later %pg_init" if new != world else "a newer view follows this world"
        elif src.startswith("%pg_status") and world is not None:
            new, why = world, "a newer view follows this world"
        else:
            continue
        if views:  # the view before this one freezes, and says why
            before = max(views)
            views[before] = (*views[before][:2], why)
        views[i] = (*new, "shut down")  # the last view: the lesson ends with %pg_shutdown
        world = new
    return views


def reopen(nb: Any, open_notebook: Any, saved: Path, views: dict[int, Any], artifacts: Path) -> dict[int, Any]:
    """Open a saved copy with a new kernel, nothing run: what each view cell shows (widgets cannot render).

    The view's widget cannot render ("Loading widget..."); under a ``%pg_init`` the outcome
    line still names the cell's own world, and no other.
    """
    copy = open_notebook("lesson01_reopened.ipynb", saved)
    shown = {}
    for cell, (scheme, size, _) in views.items():
        text = copy.output(cell).inner_text()
        shown[cell] = {"text": text, "widget_views": copy.output(cell).locator(VIEW).count()}
        if copy.cell(cell).locator(".jp-InputArea-editor").inner_text().startswith("%pg_init"):
            seen = claims(text)  # the outcome line under the view
            assert seen["init"] == {scheme} and seen["world"] == {str(size)}, (cell, seen, text)
    copy.page.screenshot(path=str(artifacts / "lesson01_reopened_without_state.png"), full_page=True)
    return shown


def test_lesson_01_in_jupyterlab_then_saved_replays_under_nbval(
    open_notebook: Any, lab_server: Any, artifacts: Path, pgnb_leftovers: Any
) -> None:
    lesson = json.loads(LESSON_01.read_text())
    views = _lesson_views(lesson["cells"])
    assert len(views) >= 5, views  # env, tcp, file, env again, and %pg_status
    assert "".join(lesson["cells"][-1]["source"]).strip() == "%pg_shutdown"
    nb = open_notebook("lesson01.ipynb", LESSON_01)
    code = nb.code_cells()
    assert code == [i for i, c in enumerate(lesson["cells"]) if c["cell_type"] == "code"]
    for i in code:
        nb.run(i, timeout_ms=INIT_TIMEOUT_MS)
    found = [check_own_world(nb, cell, scheme, size, why) for cell, (scheme, size, why) in views.items()]
    (artifacts / "lesson01_views.json").write_text(json.dumps(found, indent=1))
    saved = nb.save()
    saved_path = artifacts / "lesson01_saved_from_lab.ipynb"
    saved_path.write_text(json.dumps(saved, indent=1))
    assert not pgnb_leftovers(15.0)
    assert not controller_errors(lab_server), controller_errors(lab_server)
    # the notebook as JupyterLab saved it replays under strict nbval (what the lessons' test runs)
    from importlib.resources import files

    workdir = Path(tempfile.mkdtemp(prefix="pgnb-lab-saved-"))
    target = workdir / "lesson01_saved.ipynb"
    target.write_text(json.dumps(saved))
    env = dict(os.environ, IPYTHONDIR=str(workdir / "ipython"), JUPYTER_RUNTIME_DIR=str(workdir / "runtime"))
    cmd = [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(workdir), "-p", "no:cacheprovider",
           "--nbval", "--nbval-current-env", "--nbval-sanitize-with", str(files("pgnb") / "nbval_sanitize.cfg"),
           "-q", "-rf", "-W", "ignore:Overlapping options from comments and metadata:UserWarning", str(target)]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    (artifacts / "lesson01_saved_nbval.txt").write_text(proc.stdout + proc.stderr)
    # nbval names a missing or extra stream, not its text: show what JupyterLab's run printed there
    lab_stderr = {i: "".join(o["text"]) for i, c in enumerate(saved["cells"])
                  for o in c.get("outputs", []) if o.get("name") == "stderr"}
    assert proc.returncode == 0, (proc.stdout[-4000:], lab_stderr)

    reopened = reopen(nb, open_notebook, saved_path, views, artifacts)

    # with JupyterLab's "Save Jupyter widget state in notebooks" on, a reopened notebook shows every view's rows
    lab_server.put_setting("@jupyter-widgets/jupyterlab-manager:plugin", {"saveState": True})
    nb.page.goto(f"{lab_server.base}/lab/tree/{nb.path}?token={lab_server.token}&reset")  # only this notebook
    nb.wait_kernel_ready()  # the same kernel, which still holds the views' widgets
    for cell in views:
        _expect()(_view(nb, cell).locator(".pgnb-row")).to_have_count(views[cell][1], timeout=15_000)
    with_state = nb.save()
    assert "application/vnd.jupyter.widget-state+json" in with_state["metadata"].get("widgets", {})
    state_path = artifacts / "lesson01_saved_with_widget_state.ipynb"
    state_path.write_text(json.dumps(with_state, indent=1))
    restored = open_notebook("lesson01_restored.ipynb", state_path)
    found = [check_own_world(restored, cell, scheme, size, why) for cell, (scheme, size, why) in views.items()]
    (artifacts / "lesson01_reopened_with_state.json").write_text(json.dumps(found, indent=1))
    (artifacts / "lesson01_reopened_without_state.json").write_text(json.dumps(reopened, indent=1))

