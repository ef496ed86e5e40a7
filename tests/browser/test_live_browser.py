"""Live ``%%pg`` and a rank's debugger in JupyterLab, driven from the UI in headless Chromium.

While a training cell runs, the live view shows each rank's lane with its lines and its progress bar (checked
in the DOM, before the cell ends), then collapses to its one-line summary; the notebook JupyterLab saves
replays under strict nbval. A ``breakpoint()`` on a rank asks in JupyterLab's input box; typing ``p x`` shows
the rank's value, ``c`` finishes the cell.

Artifacts: live_view_running.png, debugger_prompt.png. PGNB_UPDATE_SCREENSHOT=1 also writes
docs/live_view.png and docs/debugger_prompt.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN = ("%%pg\nimport time\nfrom tqdm.auto import tqdm\n"
         "for step in tqdm(range(40), desc=f'rank {rank}', mininterval=0.1):\n"
         "    if step % 10 == 0:\n        print(f'rank {rank} step {step}', flush=True)\n"
         "    time.sleep(0.15)\n"
         "print(f'rank {rank} done')\n")
CELLS = ["%load_ext pgnb", "%pg_init --backend gloo --world 2", TRAIN,
         "%%pg --ranks 1\nx = 40 + rank\nbreakpoint()\nprint(x + 1)\n", "%pg_shutdown"]
LOAD, INIT, TRAIN_CELL, BREAK, SHUTDOWN = range(len(CELLS))


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _answer(box: Any, text: str) -> None:
    """Type a line into JupyterLab's input box and wait until that box is gone, so the next prompt's box is
    never confused with it (under load the next prompt can arrive before the answered box is removed)."""
    answered = box.element_handle()
    box.fill(text)
    box.press("Enter")
    answered.wait_for_element_state("hidden", timeout=15_000)


def test_live_view_and_debugger_in_jupyterlab(open_notebook: Any, artifacts: Path, pgnb_leftovers: Any,
                                              tmp_path: Path) -> None:
    expect = _expect()
    nb = open_notebook("pgnb_live.ipynb", CELLS)
    nb.run(LOAD)
    nb.run(INIT, timeout_ms=120_000)

    # --- the live view while the cell runs: both lanes, their lines, their bars
    nb.run(TRAIN_CELL, wait=False)
    live = nb.output(TRAIN_CELL).locator(".pgnb-live")
    expect(live).to_have_count(1, timeout=20_000)
    for r in (0, 1):
        lane = live.locator(f".pgnb-lane-{r}")
        expect(lane).to_contain_text(f"rank {r} step 10", timeout=20_000)
        expect(lane.locator(".pgnb-lane-text")).to_contain_text(f"rank {r}:", timeout=10_000)  # the bar's line
        expect(lane.locator(".pgnb-lane-state")).to_contain_text("running", timeout=5_000)
    bar = live.locator(".pgnb-lane-0 .pgnb-lane-text").inner_text()
    assert "%|" in bar, bar  # a progress bar, mid-way
    assert nb.prompt(TRAIN_CELL).inner_text().strip() == "[*]:", "the cell ended before the live checks"
    shot = nb.output(TRAIN_CELL)
    shot.screenshot(path=str(artifacts / "live_view_running.png"))
    if os.environ.get("PGNB_UPDATE_SCREENSHOT") == "1":
        shot.screenshot(path=str(REPO_ROOT / "docs" / "live_view.png"))

    # --- the end: one summary line, then the grouped output
    nb.wait_done(TRAIN_CELL, timeout_ms=60_000)
    expect(live.locator(".pgnb-live-phase")).to_have_text("ranks 0, 1 finished", timeout=10_000)
    expect(live.locator(".pgnb-lane")).to_have_count(0)
    text = nb.output(TRAIN_CELL).inner_text()
    assert "[rank 0]" in text and "rank 0 done" in text and "rank 1: 100%|" in text and "it/s" not in text

    # --- a breakpoint on rank 1: JupyterLab's input box, `p x`, then `c`
    nb.run(BREAK, wait=False)
    box = nb.cell(BREAK).locator(".jp-Stdin-input")
    expect(box).to_have_count(1, timeout=30_000)
    expect(nb.cell(BREAK).locator(".jp-Stdin-prompt")).to_have_text("(Pdb rank 1)", timeout=5_000)
    nb.cell(BREAK).screenshot(path=str(artifacts / "debugger_prompt.png"))
    if os.environ.get("PGNB_UPDATE_SCREENSHOT") == "1":
        nb.cell(BREAK).screenshot(path=str(REPO_ROOT / "docs" / "debugger_prompt.png"))
    _answer(box, "p x")
    expect(nb.output(BREAK)).to_contain_text("41", timeout=15_000)  # x = 40 + rank, on rank 1
    box = nb.cell(BREAK).locator(".jp-Stdin-input")
    expect(box).to_have_count(1, timeout=15_000)
    _answer(box, "c")
    nb.wait_done(BREAK, timeout_ms=30_000)
    expect(nb.output(BREAK)).to_contain_text("[rank 1]\n42", timeout=10_000)

    # --- saved from JupyterLab, the notebook replays under strict nbval (the breakpoint is skipped there)
    nb.run(SHUTDOWN, timeout_ms=60_000)
    assert pgnb_leftovers(15.0) == []
    saved = nb.save()
    replay = tmp_path / "saved.ipynb"

    # the breakpoint cell replays on the skipped path, which prints what the interactive run did not:
    # keep the notebook's own record of it out of the comparison for that one cell
    saved["cells"][BREAK]["source"] = "# NBVAL_IGNORE_OUTPUT\n" + "".join(saved["cells"][BREAK]["source"])
    replay.write_text(json.dumps(saved))
    sanitize = subprocess.run([sys.executable, "-m", "pgnb", "nbval-sanitize"], capture_output=True, text=True,
                              check=True).stdout.strip()
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "--rootdir", str(tmp_path),
                           "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
                           "--nbval-sanitize-with", sanitize, str(replay)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
