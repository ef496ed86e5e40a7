"""The package as users get it: the wheel ``make user-venv`` builds, its metadata, and ``pgnb --version``.

``make user-venv`` builds pgnb's wheel into ``dist/`` (``pip wheel``) and installs that file into
``.venv-user``; these checks read the same file. Without it (no ``make user-venv``) they skip, or
fail under ``PGNB_REQUIRE_USER_INSTALL=1`` as ``make test`` runs them as root.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
from support_matrix import COLUMNS, MAIN_PYTHON, SHARED_MIN_BYTES, share_identical_files
from test_user_install import REQUIRE_VAR, installed, user_env, user_python

import pgnb

#: it reads what make user-venv built and installed, after make test's first stage
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
WHEEL = ROOT / "dist" / f"pgnb-{pgnb.__version__}-py3-none-any.whl"
#: package data that ships beside the modules
DATA = {"pgnb/py.typed", "pgnb/nbval_sanitize.cfg", "pgnb/nbval_sanitize_third_party.cfg"}
#: what pytest's plugin list, Jupyter's and IPython's indexes look for
FRAMEWORKS = {"Framework :: Jupyter", "Framework :: IPython", "Framework :: Pytest", "Typing :: Typed"}


def _required(what: str) -> None:
    reason = f"{what}: run `make user-venv` (make test does)"
    if os.environ.get(REQUIRE_VAR) == "1":
        pytest.fail(f"{reason} ({REQUIRE_VAR}=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def wheel() -> Iterator[zipfile.ZipFile]:
    if not WHEEL.is_file():
        _required(f"no wheel at {WHEEL}")
    with zipfile.ZipFile(WHEEL) as z:
        yield z


def test_wheel_holds_the_package_and_its_data_only(wheel):
    """Every module of pgnb/ and its data; no tests, notebooks, benchmarks, docs or bytecode."""
    names = set(wheel.namelist())
    dist_info = f"pgnb-{pgnb.__version__}.dist-info/"
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "pgnb").rglob("*.py")}
    assert source - names == set(), f"modules missing from the wheel: {sorted(source - names)}"
    assert DATA <= names, f"package data missing from the wheel: {sorted(DATA - names)}"
    stray = {n for n in names - source - DATA if not n.startswith(dist_info)}
    assert not stray, f"the wheel ships files that are not pgnb's modules or data: {sorted(stray)}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_metadata(wheel):
    """Classifiers, the Python floor, the console script and the plugins' entry points, as installers read them."""
    meta = Parser().parsestr(wheel.read(f"pgnb-{pgnb.__version__}.dist-info/METADATA").decode())
    assert meta["Version"] == pgnb.__version__
    assert meta["Requires-Python"] == ">=3.10", meta["Requires-Python"]
    classifiers = set(meta.get_all("Classifier") or [])
    assert FRAMEWORKS <= classifiers, f"missing classifiers: {sorted(FRAMEWORKS - classifiers)}"
    # the Pythons the support matrix's columns and this suite run on (docs/supported_versions.md), and no other
    pythons = {c for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    tested = {column.python for column in COLUMNS.values()} | {MAIN_PYTHON}
    assert pythons == {f"Programming Language :: Python :: {v}" for v in tested}, pythons
    assert meta["Description-Content-Type"] == "text/markdown"
    # the licence the metadata names, with its text beside it
    assert meta["License-Expression"] == "BSD-3-Clause", meta["License-Expression"]
    assert f"pgnb-{pgnb.__version__}.dist-info/licenses/LICENSE" in wheel.namelist()
    entry_points = wheel.read(f"pgnb-{pgnb.__version__}.dist-info/entry_points.txt").decode()
    for line in ("pgnb = pgnb.__main__:main", "pgnb = pgnb.testing.plugin",
                 "pgnb.fork = pgnb.procs.forklauncher:ForkEngineSetLauncher"):
        assert line in entry_points, f"{line!r} not in entry_points.txt:\n{entry_points}"


def test_twine_check(wheel):
    """The metadata an index would show passes ``twine check --strict`` (the README renders, fields valid)."""
    out = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(WHEEL)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_user_venv_installed_the_built_wheel():
    """``.venv-user``'s pgnb came from dist/'s wheel file, with py.typed among its installed files."""
    python = user_python()
    if python is None:
        _required("no user-install venv")
    dist = installed(python)["pgnb"]
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    url = direct.get("url", "")
    assert "archive_info" in direct and url.endswith(WHEEL.name), f"pgnb was not installed from the wheel: {direct}"
    assert any(str(f) == "pgnb/py.typed" for f in dist.files or []), "py.typed is not installed"


def test_version_in_the_user_venv():
    """``pgnb --version`` and ``python -m pgnb --version`` print pgnb's version and what it runs on."""
    python = user_python()
    if python is None:
        _required("no user-install venv")
    script = Path(python).parent / "pgnb"
    for argv in ([str(script), "--version"], [python, "-m", "pgnb", "--version"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=user_env(), cwd="/")
        assert out.returncode == 0 and not out.stderr, (argv, out.stdout, out.stderr)
        line = out.stdout.strip()
        assert line.startswith(f"pgnb {pgnb.__version__} (torch 2."), line
        assert "ipyparallel 9." in line and f"Python {sys.version_info[0]}." in line, line


def test_the_matrix_columns_keep_one_copy_of_the_files_they_share(tmp_path):
    """Large identical files across the columns' venvs end as one inode; different or small ones do not."""
    big, other, small = b"a" * SHARED_MIN_BYTES, b"b" * SHARED_MIN_BYTES, b"c" * 100
    folders = [tmp_path / "one", tmp_path / "two", tmp_path / "three"]
    for folder in folders:
        (folder / "lib").mkdir(parents=True)
        (folder / "lib" / "cuda.so").write_bytes(big)
        (folder / "small.py").write_bytes(small)
    (folders[2] / "lib" / "cuda.so").write_bytes(other)  # the same size, another build

    assert share_identical_files(folders) == SHARED_MIN_BYTES
    inode = [(f / "lib" / "cuda.so").stat().st_ino for f in folders]
    assert inode[0] == inode[1] != inode[2]
    assert len({(f / "small.py").stat().st_ino for f in folders}) == 3
    assert [(f / "lib" / "cuda.so").read_bytes() for f in folders] == [big, big, other]
    assert not list(tmp_path.rglob("*.pgnb-link"))
    assert share_identical_files(folders) == 0  # what is shared already is not counted again
