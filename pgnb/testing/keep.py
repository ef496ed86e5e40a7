"""``pytest --pgnb-keep``: hand the run to this project's kept pytest process (``pgnb.testing.keeper``).

The client's side, run before collection (``pytest_cmdline_main``): find the keeper of this user, project
and interpreter by its socket, hand it the run (arguments, directory, environment, and the terminal as
file descriptors), forward a Ctrl-C, and exit with the keeper's exit status. With no keeper yet, the run
runs here, cold, as without the option. Once it has collected it forks the keeper (which then has what this
run imported), and when it ends (its worlds stopped) it wakes it: the keeper starts the worlds this run used
while the developer edits. A run that cannot be handed
over (``-n`` workers, ``--cov``, the keeper busy with another run) runs here after one line that says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from types import FrameType
from typing import Any

import pytest

from ..core.files import MAX_SOCKET_PATH
from . import keeper

OPTION = "--pgnb-keep"
INI = "pgnb_keep"
IDLE_INI = "pgnb_keep_idle"
#: Seconds a kept process waits for its next run before it ends (and stops its worlds).
DEFAULT_IDLE = 600.0
_KEEPER = pytest.StashKey[tuple[str, str, float]]()  # a cold run's: the kept process to start when it ends
_WARM = pytest.StashKey[dict[str, Any]]()  # what that process starts before the next run: worlds, preloads
_FORKED = pytest.StashKey[Any]()  # that process, forked from this one at collection's end, waiting for its end


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("pgnb").addoption(
        OPTION, action="store_true", dest="pgnb_keep", default=False,
        help="hand the run to this project's kept pytest process (torch imported, worlds warm; started by the "
             f"first run, ended after {IDLE_INI} idle seconds)")
    parser.addini(INI, f"as {OPTION}", type="bool", default=False)
    parser.addini(IDLE_INI, f"seconds a kept pytest process waits for a run before it ends (default {DEFAULT_IDLE:g})",
                  default="")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if keeper.root is not None or hasattr(config, "workerinput"):
        return None  # the keeper's own run, or a pytest-xdist worker's (its controller ran here)
    if not (config.getoption("pgnb_keep", False) or config.getini(INI)):
        return None
    why_not = _why_not_kept(config)
    if why_not:
        _here(why_not)
        return None
    name = hashlib.sha256(f"{os.path.realpath(config.rootpath)}\0{sys.executable}".encode()).hexdigest()[:16]
    folder = _own_folder(f"{name}.sock")
    if folder.startswith("!"):
        _here(folder[1:])
        return None
    path = os.path.join(folder, f"{name}.sock")
    with open(os.path.join(folder, f"{name}.lock"), "a") as held:
        try:  # one run at a time: held by the client whose run the keeper runs
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _here("the kept process is running another run")
            return None
        conn = _connect(path)
        if conn is None:  # this run is the cold one; the kept process starts when it ends (pytest_unconfigure)
            config.stash[_KEEPER] = (path, os.path.join(folder, f"{name}.log"), _idle(config))
            sys.stderr.write(f"pgnb: {OPTION}: nothing kept for this project yet: this run runs here, and "
                             "leaves a kept process warm for the next\n")
            return None
        with conn:
            return _run(conn, config)


def pytest_report_header(config: pytest.Config) -> str | None:
    if keeper.root is None:
        return None
    return f"pgnb: kept process {os.getpid()}, run {keeper.runs}; the project's modules imported anew"


def _why_not_kept(config: pytest.Config) -> str:
    if getattr(config.option, "numprocesses", None):
        return "pytest-xdist's workers each keep their own worlds"
    if getattr(config.option, "cov_source", None) and not getattr(config.option, "no_cov", False):
        return "--cov measures the pytest process it started in"
    return ""


def _here(why: str) -> None:
    sys.stderr.write(f"pgnb: {OPTION}: this run is not handed to a kept process ({why}); it runs here\n")


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_collection_finish(session: pytest.Session) -> object:
    """The cold run's kept process, forked now: it has what this run imported (pytest, its plugins, torch and
    torch's harness for ``--pgnb-torch``), so it serves the next run without importing them again. It waits
    until this run ends (``pytest_unconfigure``), and ends with it if it is never woken."""
    result = yield
    started = session.config.stash.get(_KEEPER, None)
    if started is not None:
        from ..core import cluster

        path, log, idle = started
        forked = cluster.fork_waiting(keeper.woken(path, str(session.config.rootpath), idle), log)
        if isinstance(forked, str):  # a thread, or a tracer: it is started afresh when the run ends
            if session.config.option.verbose > 0:
                sys.stderr.write(f"pgnb: {OPTION}: the kept process is not forked from this run ({forked})\n")
        else:
            session.config.stash[_FORKED] = forked
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The worlds this cold run used, for the kept process to start before the next run asks for them."""
    if _KEEPER in session.config.stash:
        from ..core import cluster
        from .plugin import pool_of

        pool = pool_of(session.config)
        worlds = [keeper.spec_options(key) for key in (pool.worlds() if pool is not None else ())]
        session.config.stash[_WARM] = {"worlds": [w for w in worlds if w is not None],
                                       "preload": list(cluster.ZYGOTE_PRELOAD)}


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After this cold run's worlds stopped (no two worlds at once): start the kept process for the next run."""
    started = config.stash.get(_KEEPER, None)
    if started is None:
        return
    path, log, idle = started
    warm: dict[str, Any] = config.stash.get(_WARM, {"worlds": [], "preload": []})
    forked = config.stash.get(_FORKED, None)
    if forked is not None:
        forked.wake(warm)
        pid = forked.pid
    else:
        with open(log, "ab") as out:
            pid = subprocess.Popen(
                [sys.executable, "-m", "pgnb.testing.keeper", "--socket", path, "--root", str(config.rootpath),
                 "--idle", str(idle), "--warm", json.dumps(warm)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=str(config.rootpath),
                start_new_session=True).pid
    sys.stderr.write(f"pgnb: {OPTION}: the kept process (pid {pid}) warms up for the next run; it ends "
                     f"after {idle:g} s without one\n")


def _own_folder(socket_name: str) -> str:
    """The folder of this user's kept processes' sockets (0700, this user's), made if need be: in
    ``$XDG_RUNTIME_DIR``, else (or where a socket's path there would be too long) the temporary folder;
    ``!why`` if there is none fit."""
    bases = [base for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir()) if base]
    for base in bases:
        folder = os.path.join(base, f"pgnb-keep-{os.getuid()}")
        if len(os.path.join(folder, socket_name)) + 12 > MAX_SOCKET_PATH:  # + the keeper's ".PID" while it binds
            continue
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            return f"!{folder} is not a folder only this user can open"
        return folder
    return f"!no folder for its socket: {' and '.join(bases)} give paths too long for a Unix socket"


def _idle(config: pytest.Config) -> float:
    value = config.getini(IDLE_INI)
    try:
        return float(value) if value else DEFAULT_IDLE
    except ValueError:
        raise pytest.UsageError(f"{IDLE_INI} must be a number of seconds, not {value!r}") from None


def _connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):  # none, or a stale socket: its keeper is gone
        conn.close()
        with contextlib.suppress(FileNotFoundError):
            if os.path.exists(path):
                os.unlink(path)
        return None
    return conn


def _run(conn: socket.socket, config: pytest.Config) -> int:
    request = {"args": [str(a) for a in config.invocation_params.args], "cwd": os.getcwd(), "env": dict(os.environ)}
    keeper.send_message(conn, request, list(range(keeper.FDS)))

    def interrupt(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b"interrupt")

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        while True:
            try:
                reply: dict[str, Any] = keeper.receive_message(conn)[0]
                return int(reply["exit"])
            except InterruptedError:
                continue
            except (EOFError, OSError, KeyError, ValueError):
                sys.stderr.write(f"pgnb: {OPTION}: the kept process ended during the run\n")
                return int(pytest.ExitCode.INTERNAL_ERROR)
    finally:
        signal.signal(signal.SIGINT, previous)
