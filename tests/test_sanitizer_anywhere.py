"""pgnb's nbval sanitizer from any checkout, and the opt-in patterns for other libraries' output.

``python -m pgnb nbval-sanitize`` writes the sanitizer into a per-user cache directory: from an
editable install the packaged file lies inside pgnb's checkout, and pytest, counting that path
among those it derives its rootdir from, would adopt pgnb's checkout and its ``pyproject.toml``.
Here a user's notebook in a folder of its own is recorded with nbclient and replayed under strict
nbval with that file, and pytest's rootdir is the notebook's folder. The third-party patterns are
each held to replacing only what differs between runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nbval.plugin import get_sanitize_patterns

ROOT = Path(__file__).resolve().parent.parent


def _sanitizer(cache: Path, *flags: str) -> Path:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    out = subprocess.run([sys.executable, "-m", "pgnb", "nbval-sanitize", *flags], env=env, cwd=cache.parent,
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def _sanitize(text: str, patterns: list[tuple[str, str]]) -> str:
    for regex, replace in patterns:  # as nbval applies them: in order, each to the whole text
        text = re.sub(regex, replace, text)
    return text


# ---- the file, written outside the checkout (no engines) --------------------------------


def test_the_sanitizer_is_written_outside_the_checkout_and_rewritten_only_when_it_changed(tmp_path):
    from importlib.resources import files

    path = _sanitizer(tmp_path / "cache")
    assert path == tmp_path / "cache" / "pgnb" / "nbval_sanitize.cfg"
    assert path.read_text() == (files("pgnb") / "nbval_sanitize.cfg").read_text()
    path.write_text("stale")
    assert _sanitizer(tmp_path / "cache") == path and path.read_text() != "stale"
    both = _sanitizer(tmp_path / "cache", "--third-party")
    assert both.parent == path.parent
    assert both.read_text() == path.read_text() + "\n" + (files("pgnb") / "nbval_sanitize_third_party.cfg").read_text()
    assert get_sanitize_patterns(both.read_text())[:2] == get_sanitize_patterns(path.read_text())


# ---- each third-party pattern replaces only what it must ---------------------------------


@pytest.fixture(scope="module")
def third_party() -> list[tuple[str, str]]:
    from importlib.resources import files

    return get_sanitize_patterns((files("pgnb") / "nbval_sanitize_third_party.cfg").read_text())


@pytest.mark.parametrize(("printed", "kept"), [
    # logging's %(asctime)s, and the ISO form
    ("2026-05-09 07:35:25,123 INFO epoch 3: loss 0.25 (lr 1e-3)",
     "YYYY-MM-DD HH:MM:SS INFO epoch 3: loss 0.25 (lr 1e-3)"),
    ("[2026-05-09T07:35:25.123456] step 12/50", "[YYYY-MM-DD HH:MM:SS] step 12/50"),
    ("torch 2.13.0 at 12:30, shape 2026-05", "torch 2.13.0 at 12:30, shape 2026-05"),
    # torch.multiprocessing.spawn's first failed child: its number goes, the exit code stays
    ("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 1",
     "torch.multiprocessing.spawn.ProcessExitedException: process N terminated with exit code 1"),
    ("-- Process 0 terminated with the following error:", "-- Process N terminated with the following error:"),
    ("process group 0 on rank 1, process 3 started", "process group 0 on rank 1, process 3 started"),
    # the notebook kernel's own cell files
    ("/tmp/ipykernel_4242/1234567.py:7: UserWarning: careful", "Cell, line 7: UserWarning: careful"),
    ('  File "/tmp/ipykernel_4242/1234567.py", line 3, in <module>', '  File "Cell", line 3, in <module>'),
    ("python -m ipykernel_launcher -f kernel.json", "python -m ipykernel_launcher -f kernel.json"),
])
def test_each_third_party_pattern_replaces_only_what_differs_between_runs(third_party, printed, kept):
    assert _sanitize(printed, third_party) == kept


def test_pgnb_own_patterns_leave_third_party_samples_alone():
    from importlib.resources import files

    own = get_sanitize_patterns((files("pgnb") / "nbval_sanitize.cfg").read_text())
    text = "2026-05-09 07:35:25,123 process 1 terminated with exit code 1"
    assert _sanitize(text, own) == text


# ---- a user's notebook, outside the checkout, under strict nbval ---------------------------


#: a rank's warning names the cell, not the engine's temporary file: the replay must give the same bytes
WARNING_CELL = "%%pg\nimport warnings\nwarnings.warn(f'rank {rank} is careful')"


def _user_notebook(folder: Path) -> Path:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(src) for src in
                             ("%load_ext pgnb", "%pg_init --world 2", "%%pg\nprint(rank)", WARNING_CELL,
                              "%pg_shutdown")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "mine.ipynb"
    nbformat.write(nb, str(path))
    return path


@pytest.mark.integration
def test_a_users_notebook_replays_with_pgnb_sanitizer_and_its_own_rootdir(tmp_path):
    from test_notebooks import refresh

    folder = tmp_path / "my project"
    folder.mkdir()
    notebook = _user_notebook(folder)
    refresh([notebook])  # executed and saved as the user would, with nbclient
    import nbformat

    warned = "".join(o.get("text", "") for o in nbformat.read(str(notebook), as_version=4).cells[3].outputs)
    assert "Cell, line 2: UserWarning: rank 0 is careful" in warned and "/tmp/" not in warned, warned
    sanitizer = _sanitizer(tmp_path / "cache")
    assert ROOT not in sanitizer.parents
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env.update(IPYTHONDIR=str(tmp_path / "ipython"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    # the command of docs/testing_notebooks.md, in the notebook's folder
    replay = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
                             f"--nbval-sanitize-with={sanitizer}", notebook.name],
                            cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    out = replay.stdout + replay.stderr
    assert replay.returncode == 0, out
    assert f"rootdir: {folder}\n" in out and "configfile" not in out, out
    assert "5 passed" in out, out
    # the path as a separate argument: pytest counts it, but pgnb's checkout and settings stay out
    collect = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-sanitize-with", str(sanitizer),
                              "--collect-only", notebook.name], cwd=folder, env=env, capture_output=True, text=True,
                             timeout=60)
    assert collect.returncode == 0 and str(ROOT) not in collect.stdout, collect.stdout + collect.stderr
