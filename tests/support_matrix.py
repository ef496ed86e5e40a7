"""The support matrix: the versions pgnb claims, tested (``make matrix``; docs/supported_versions.md).

Each column below is a venv of its own (``.venv-matrix-<column>``): a Python, pins, and pgnb with its
test extra installed (editable) over them. Every column runs the same subset of the suite, ``TESTS``:
the private names pgnb relies on, the core cells, a tutorial's own ``init_process_group()``, a strict
nbval replay of a lesson, the pytest plugin, and ``--pgnb-torch`` on a small torch suite. When every
column passes, the table in docs/supported_versions.md is rewritten with the versions each venv really
had and the date (``--no-docs`` leaves it).

    python tests/support_matrix.py                  # build what is missing, run every column
    python tests/support_matrix.py --install-only   # build the venvs only (CI starts this early)

Standard library only: it runs before any venv exists. A venv is rebuilt only when its column, pgnb's
requirements (its dependencies and test extra) or, for ``newest``, the day changed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "supported_versions.md"


@dataclass(frozen=True)
class Column:
    what: str
    python: str  # "3.10": found on PATH or under pyenv's versions
    pins: tuple[str, ...]  # pip constraints; none: whatever the index serves today


#: The columns, named here and nowhere else.
COLUMNS = {
    # pyproject.toml's floor for every requirement, on the oldest Python it allows
    "oldest": Column("the oldest release of every requirement that pyproject.toml allows, on its oldest Python",
                     "3.10", ("torch==2.12.0", "ipyparallel==9.0.0", "ipython==8.12.0", "ipykernel==6.29.0",
                              "ipywidgets==8.1.0", "psutil==5.9.0", "numpy==1.26.0", "matplotlib==3.8.0")),
    # torch from the index is a CUDA build, used on the CPU; 3.11, between them, is the main suite's (make test)
    "py3.12": Column("the newest releases the package index serves, on Python 3.12", "3.12", ()),
    # the newest Python this image has (pyenv's)
    "newest": Column("the newest releases the package index serves, on the newest Python here", "3.13", ()),
}
#: The Python the main suite (make test) runs on: the machine's python3, for which torch's CPU build lies on disk.
MAIN_PYTHON = "3.11"
#: What every column runs: one of each kind of thing pgnb does, chosen to be quick.
TESTS = (
    "tests/test_private_names.py::test_private_name_is_where_pgnb_expects_it",
    "tests/test_cells.py",
    "tests/test_tutorials.py::test_a_tutorials_main_runs_after_pg_destroy_again_and_again",
    "tests/test_notebooks.py::test_notebook_replays_under_strict_nbval[run1-02_collectives]",
    "tests/test_plugin.py::test_world_tests_in_one_session",
    "tests/test_torch_suites.py::test_verdicts_on_warm_ranks",
)
#: The versions the table shows, as each venv has them.
SHOWN = ("torch", "ipyparallel", "ipython", "ipykernel", "ipywidgets", "jupyter_client", "pyzmq", "numpy",
         "matplotlib", "psutil", "nbval", "pytest")
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
#: Files this large or larger are stored once across the columns (share_identical_files); smaller ones are not
#: worth reading twice.
SHARED_MIN_BYTES = 1 << 20


def venv_dir(name: str) -> Path:
    return ROOT / f".venv-matrix-{name}"


def find_python(version: str) -> str:
    """A python of ``version``: pyenv's (its shims answer only for the selected version), else on PATH."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.split("/versions/")[1].split("/")[0])])
    on_path = shutil.which(f"python{version}")
    check = f"import sys; assert sys.version_info[:2] == {tuple(map(int, version.split('.')))}"
    for exe in [*reversed(found), *([on_path] if on_path else [])]:
        if subprocess.run([exe, "-c", check], capture_output=True).returncode == 0:
            return exe
    raise SystemExit(f"support matrix: no Python {version} here (looked under {root}/versions and on PATH)")


def stamp(name: str) -> str:
    """What a column's venv was built from: a change rebuilds it."""
    column = COLUMNS[name]
    text = (ROOT / "pyproject.toml").read_text()
    try:  # pgnb's requirements and its test extra; not the rest of the file (a classifier rebuilds nothing)
        import tomllib

        project = tomllib.loads(text)["project"]
        wanted: object = [project["dependencies"], project["optional-dependencies"]["test"]]
    except (ImportError, KeyError):
        wanted = text
    day = datetime.date.today().isoformat() if not column.pins else ""
    return hashlib.sha256(json.dumps([column.python, column.pins, wanted, day]).encode()).hexdigest()


def install(name: str) -> float:
    """Build the column's venv unless it is built from the same things; returns the seconds it took."""
    column, venv = COLUMNS[name], venv_dir(name)
    mark = venv / "pgnb-matrix-stamp"
    if mark.is_file() and mark.read_text() == stamp(name) and (venv / "bin" / "python").exists():
        return 0.0
    t0 = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([find_python(column.python), "-m", "venv", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in column.pins))
    log = venv / "install.log"
    with log.open("w") as out:
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                               "-q", "-c", str(constraints), "-e", f"{ROOT}[test]"],
                              stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"support matrix: column {name}: pip failed (see {log}):\n{log.read_text()[-3000:]}")
    mark.write_text(stamp(name))
    return time.monotonic() - t0


def share_identical_files(folders: list[Path]) -> int:
    """Hard-link the columns' identical large files (CUDA's libraries, torch's, triton's) to one copy each.

    The columns hold several GB each, mostly the same wheels' files; on a machine whose disk is shared,
    one copy of them is the difference between a run that fits and one that fails with "No space left".
    pip replaces a file by unlinking it, so a later install in one venv leaves the others' copies alone.
    Returns the bytes freed."""
    by_size: dict[int, list[Path]] = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.stat().st_size >= SHARED_MIN_BYTES:
                by_size.setdefault(path.stat().st_size, []).append(path)
    freed = 0
    for size, paths in by_size.items():
        if len(paths) < 2:
            continue
        first_by_digest: dict[str, Path] = {}
        digest_by_inode: dict[int, str] = {}  # a file already shared is read once
        for path in paths:
            inode = path.stat().st_ino
            if inode not in digest_by_inode:
                digest = hashlib.sha256()
                with path.open("rb") as f:
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
                digest_by_inode[inode] = digest.hexdigest()
            first = first_by_digest.setdefault(digest_by_inode[inode], path)
            if first.stat().st_ino == inode:
                continue
            spare = path.with_name(path.name + ".pgnb-link")
            os.link(first, spare)
            os.replace(spare, path)  # atomic: the path is never missing
            freed += size
    return freed


def versions(name: str) -> dict[str, str]:
    code = ("import json, platform\nfrom importlib.metadata import version\n"
            f"v = {{n: version(n) for n in {SHOWN!r}}}\nv['Python'] = platform.python_version()\nprint(json.dumps(v))")
    out = subprocess.run([str(venv_dir(name) / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         check=True)
    return dict(json.loads(out.stdout))


def run_tests(name: str, workers: int) -> tuple[int, float, str]:
    """TESTS in the column's venv: (exit status, seconds, the report's last lines)."""
    python = str(venv_dir(name) / "bin" / "python")
    # the notebook replays run in this python (no user-install venv); tests/conftest.py gives the run its own
    # IPYTHONDIR and temporary folder, removed at its end
    env = {k: v for k, v in os.environ.items() if k not in ("PGNB_USER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    spread = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
    args = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *spread, *TESTS]
    t0 = time.monotonic()
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    (venv_dir(name) / "pytest.log").write_text(done.stdout + done.stderr)
    return done.returncode, seconds, "\n".join((done.stdout + done.stderr).splitlines()[-40:])


def table(results: dict[str, dict[str, str]], when: str) -> str:
    names = list(results)
    rows = ["| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---|" * len(names)]
    rows.append("| what | " + " | ".join(COLUMNS[n].what for n in names) + " |")
    rows.append("| tests | " + " | ".join(results[n]["tests"] for n in names) + " |")
    for package in ("Python", *SHOWN):
        rows.append(f"| {package} | " + " | ".join(results[n][package] for n in names) + " |")
    return "\n".join([*rows, "", f"*Last green run: {when}, `make matrix` (tests/support_matrix.py).*"])


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--columns", default=",".join(COLUMNS), help="comma-separated (default: all)")
    parser.add_argument("--install-only", action="store_true", help="build the venvs, run nothing")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/supported_versions.md as it is")
    parser.add_argument("--jobs", type=int, default=1, help="columns run at once (each with --workers)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per column")
    args = parser.parse_args(argv)
    names = [n for n in args.columns.split(",") if n]
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        parser.error(f"unknown column(s) {', '.join(unknown)}; the columns are {', '.join(COLUMNS)}")
    for name in names:
        seconds = install(name)
        print(f"matrix: {name}: venv " + (f"built in {seconds:.0f} s" if seconds else "up to date"), flush=True)
        built = [n for n in COLUMNS if (venv_dir(n) / "bin" / "python").exists()]
        if seconds and len(built) > 1:  # before the next column is built, so its peak holds one copy too
            freed = share_identical_files([venv_dir(n) for n in built])
            print(f"matrix: {freed / 2**30:.1f} GiB of files the columns have in common now stored once", flush=True)
    if args.install_only:
        return 0
    failed = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        runs = {name: pool.submit(run_tests, name, args.workers) for name in names}
        outcomes = {}
        for name, future in runs.items():
            code, seconds, tail = future.result()
            last = tail.splitlines()[-1] if tail else ""
            outcomes[name] = f"{last.strip(' =').split(' in ')[0]} in {seconds:.0f} s"
            print(f"matrix: {name}: tests {'passed' if code == 0 else 'FAILED'} in {seconds:.0f} s "
                  f"({venv_dir(name) / 'pytest.log'}): {last}", flush=True)
            if code:
                failed.append(name)
                print(tail, flush=True)
    results = {name: versions(name) for name in names}
    for name in names:
        print(f"matrix: {name}: " + ", ".join(f"{k} {v}" for k, v in results[name].items()), flush=True)
        results[name]["tests"] = outcomes[name]
    if failed:
        print(f"matrix: FAILED: {', '.join(failed)}", flush=True)
        return 1
    if not args.no_docs and names == list(COLUMNS):
        write_doc(table(results, datetime.date.today().isoformat()))
        print(f"matrix: {DOC.relative_to(ROOT)} rewritten", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
