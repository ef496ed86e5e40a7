"""pgnb's status view, rendered by JupyterLab in a real (headless) browser.

Runs the magics from the notebook UI and checks the *widget* DOM (elements
with ``.jupyter-widgets``), never the text/plain fallback, which carries the
same words (reference pitfall 9). The DOM contract the view keeps, through
ipywidgets' ``add_class``:

    .pgnb-view                      the view's root (a widget)
      .pgnb-header                  backend and "world N"
      .pgnb-row.pgnb-rank-{r}       one row per rank
        .pgnb-state                 text: starting|pending|initialized|failed|destroyed|lost
      .pgnb-refresh, .pgnb-shutdown buttons
      .pgnb-frozen                  only once frozen: "frozen: <why>"

A live view's parts are widgets; a frozen one (replaced, shut down, or
followed by a newer view) is one static HTML widget, ``.pgnb-static``, with
the same classes inside and disabled ``<button>`` elements.

Artifacts (ARTIFACTS_DIR, default a pytest tmp dir): status_widget_*.png,
jupyter_server.log, timings.json. PGNB_UPDATE_SCREENSHOT=1 also writes
docs/status_widget.png. PGNB_BROWSER_EXTENSION=standin_pgnb runs the same
test against a stand-in (this folder) to check the harness without pgnb.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from pgnb._wire import RANK_STATES as STATES

pytestmark = pytest.mark.browser

# Same knobs as conftest.py (not imported from it: conftest is not a module to import).
EXTENSION = os.environ.get("PGNB_BROWSER_EXTENSION", "pgnb")
REPO_ROOT = Path(__file__).resolve().parents[2]
UI_TIMEOUT_MS = 60_000

WORLD = 4
NOT_INITIALIZED = re.compile(r"^(starting|pending|failed|destroyed|lost)$")
VIEW = ".jupyter-widgets.pgnb-view"
ROW = ".pgnb-row"  # inside VIEW (a widget): a widget while live, static HTML once frozen
STATE = ".pgnb-state"
INIT_LINE = f"%pg_init --backend gloo --world {WORLD} --delay-rank 3:2"

# One notebook, run top to bottom from the UI.
LOAD, INIT, DESTROY, REINIT, BEHIND_BACK, SHUTDOWN = range(6)
CELLS = [
    f"%load_ext {EXTENSION}",
    INIT_LINE,  # rank 3 joins 2 s late: intermediate states are on screen meanwhile
    "%pg_destroy",
    INIT_LINE,  # destroy, then re-init on the same engines
    # Destroy the group on the ranks without telling pgnb (Sandbox.client is
    # public): only a refresh that really re-queries the ranks can notice.
    f"""import {EXTENSION} as pgnb

def destroy_behind_pgnbs_back():
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()

pgnb.current().client[:].apply_sync(destroy_behind_pgnbs_back);""",
    "%pg_shutdown",
]

# Records every distinct (rank, state) picture of one cell's view, from a
# MutationObserver: it sees each rendered state, however briefly it was up.
WATCH_STATES_JS = """([cellIndex, viewSel, rowSel, stateSel]) => {
  const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[cellIndex];
  const seen = window.__pgnbSeen = [];
  const t0 = performance.now();
  const snap = () => {
    const rows = [...cell.querySelectorAll(`${viewSel} ${rowSel}`)].map(r => {
      const cls = [...r.classList].find(c => /^pgnb-rank-\\d+$/.test(c));
      const st = r.querySelector(stateSel);
      return [cls ? Number(cls.slice(10)) : null, st ? st.innerText.trim() : null];
    });
    const key = JSON.stringify(rows);
    if (!seen.length || seen[seen.length - 1].key !== key)
      seen.push({t: (performance.now() - t0) / 1000, key, rows});
  };
  window.__pgnbObserver = new MutationObserver(snap);
  window.__pgnbObserver.observe(cell, {subtree: true, childList: true, characterData: true, attributes: true});
  snap();
}"""


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _view(nb: Any, cell: int) -> Any:
    """The one pgnb view in a finished cell's output (as widget DOM, not the text fallback)."""
    view = nb.output(cell).locator(VIEW)
    try:
        _expect()(view).to_have_count(1, timeout=15_000)
    except AssertionError:
        outputs = nb.output(cell).locator(".jp-OutputArea-output")
        mimes = [outputs.nth(i).get_attribute("data-mime-type") for i in range(outputs.count())]
        pytest.fail(
            f"cell {cell} shows no rendered {VIEW} widget; its outputs are {mimes} "
            f"(no widget-view output = widget manager missing): {nb.output(cell).inner_text()[:500]!r}"
        )
    return view


def _state(view: Any, rank: int) -> Any:
    return view.locator(f"{ROW}.pgnb-rank-{rank} {STATE}")


def _expect_states(view: Any, expected: str | re.Pattern[str], timeout_ms: int = UI_TIMEOUT_MS) -> None:
    _expect()(view.locator(ROW)).to_have_count(WORLD, timeout=timeout_ms)
    for r in range(WORLD):
        _expect()(_state(view, r)).to_have_text(expected, timeout=timeout_ms)


def _states(view: Any) -> list[str]:
    return [_state(view, r).inner_text().strip() for r in range(WORLD)]


def _run_clean(nb: Any, cell: int, timeout_ms: int = UI_TIMEOUT_MS) -> None:
    nb.run(cell, timeout_ms=timeout_ms)
    errors = nb.error_outputs(cell)
    assert not errors, f"cell {cell} ({CELLS[cell].splitlines()[0]!r}) wrote stderr/traceback: {errors}"


def _widget_output(nb: Any, cell: int) -> Any:
    return nb.output(cell).locator(".jp-OutputArea-output").filter(has=nb.page.locator(VIEW)).first


def test_status_view_live_in_jupyterlab(
    open_notebook: Any, lab_server: Any, artifacts: Path, pgnb_process_list: Any, pgnb_leftovers: Any
) -> None:
    expect = _expect()
    t0 = time.monotonic()
    timings: dict[str, Any] = {"server_start": round(lab_server.startup_s, 2)}

    def mark(name: str) -> None:
        timings[name] = round(time.monotonic() - t0, 2)

    nb = open_notebook("pgnb_status.ipynb", CELLS)
    page = nb.page
    mark("lab_loaded_kernel_ready")
    timings.update({f"open_{k}": round(v, 2) for k, v in nb.timings.items()})

    _run_clean(nb, LOAD)

    # --- %pg_init: live states while rank 3 is late, then all initialized
    page.evaluate(WATCH_STATES_JS, [INIT, VIEW, ROW, STATE])
    _run_clean(nb, INIT, timeout_ms=120_000)
    mark("pg_init_done")
    view = _view(nb, INIT)
    _expect_states(view, "initialized", timeout_ms=10_000)
    seen = page.evaluate("window.__pgnbObserver.disconnect(), window.__pgnbSeen")
    # a row can be on screen a moment before its state cell (child views render async)
    pictures = [{r: s for r, s in snap["rows"] if s is not None} for snap in seen]
    all_up = next((i for i, p in enumerate(pictures) if len(p) == WORLD and set(p.values()) == {"initialized"}), None)
    assert all_up is not None, f"never saw all {WORLD} rows initialized: {seen}"
    before = {s for p in pictures[:all_up] for s in p.values()}
    assert before & {"starting", "pending"}, (
        f"no 'starting'/'pending' state was rendered before all ranks were initialized "
        f"(the view does not update live?): {[s['key'] for s in seen]}"
    )
    unknown = {s for p in pictures for s in p.values()} - set(STATES)
    assert not unknown, f"states outside the contract were rendered: {unknown}"
    assert "failed" not in before, f"a rank failed on the way: {[s['key'] for s in seen]}"
    header = view.locator(".jupyter-widgets.pgnb-header")
    expect(header).to_have_count(1)
    expect(header).to_contain_text("gloo")
    expect(header).to_contain_text(f"world {WORLD}")
    expect(view.locator(".jupyter-widgets.pgnb-refresh")).to_have_count(1)
    expect(view.locator(".jupyter-widgets.pgnb-shutdown")).to_have_count(1)
    assert page.get_by_text("Error displaying widget").count() == 0
    timings["states_seen"] = [s["key"] for s in seen]

    procs = pgnb_process_list()
    assert len(procs) >= WORLD, (
        f"expected pgnb to mark its processes (>= {WORLD}) with PGNB_OWNER, found {procs}; "
        "without the mark the leftover-process check below proves nothing"
    )

    shot = _widget_output(nb, INIT)
    shot.screenshot(path=str(artifacts / "status_widget_initialized.png"))
    if os.environ.get("PGNB_UPDATE_SCREENSHOT") == "1":
        (REPO_ROOT / "docs").mkdir(exist_ok=True)
        shot.screenshot(path=str(REPO_ROOT / "docs" / "status_widget.png"))
    mark("screenshot")

    # refresh on a healthy world keeps it healthy
    timings["refresh_s"] = round(nb.click_widget(view.locator(".pgnb-refresh")), 2)
    _expect_states(view, "initialized", timeout_ms=5_000)

    # --- %pg_destroy updates the view that %pg_init displayed
    _run_clean(nb, DESTROY)
    _expect_states(view, "destroyed", timeout_ms=15_000)
    mark("pg_destroy_done")
    nb.click_widget(view.locator(".pgnb-refresh"))
    _expect_states(view, "destroyed", timeout_ms=5_000)  # a re-query does not resurrect it
    _widget_output(nb, INIT).screenshot(path=str(artifacts / "status_widget_destroyed.png"))

    # --- re-init on the same engines, then a change behind pgnb's back that only a refresh can see
    _run_clean(nb, REINIT, timeout_ms=120_000)
    view2 = _view(nb, REINIT)
    _expect_states(view2, "initialized", timeout_ms=10_000)
    # the first view keeps its own world's last picture (destroyed), and says why it no longer follows
    expect(view.locator(".pgnb-frozen")).to_have_text("frozen: replaced by a later %pg_init", timeout=10_000)
    _expect_states(view, "destroyed", timeout_ms=5_000)
    expect(view.locator("button.pgnb-refresh[disabled]")).to_have_count(1)
    mark("reinit_done")
    _run_clean(nb, BEHIND_BACK)
    nb.click_widget(view2.locator(".pgnb-refresh"))
    _expect_states(view2, NOT_INITIALIZED, timeout_ms=10_000)
    timings["states_after_refresh"] = _states(view2)
    mark("refresh_requeried")

    # --- %pg_shutdown: nothing of ours is left
    _run_clean(nb, SHUTDOWN, timeout_ms=60_000)
    mark("pg_shutdown_done")
    _expect_states(view2, NOT_INITIALIZED, timeout_ms=5_000)
    expect(view2.locator(".pgnb-frozen")).to_have_text("frozen: shut down", timeout=10_000)
    left = pgnb_leftovers(15.0)
    mark("no_leftovers")
    assert not left, f"processes marked PGNB_OWNER still alive after %pg_shutdown: {left}"

    assert not nb.traffic.page_errors, nb.traffic.page_errors
    (artifacts / "timings.json").write_text(json.dumps(timings, indent=1))
    print("timings (s):", timings, "artifacts:", artifacts)
