"""``pytest --pgnb-keep``'s keeper: one warm pytest process per user and project, which runs the runs it is handed.

A developer runs the same distributed test after every edit. Most of a cold run is fixed cost: Python's
and pytest's start, importing torch and torch's test harness (in pytest's process and on every rank), and
starting a world. The keeper pays it once. The first, cold ``--pgnb-keep`` run forks it once it has
collected (``pgnb.testing.keep``; the child has pytest, its plugins, torch and torch's harness imported
already) and wakes it when it ends; it then forks its worlds' zygotes from itself and starts the worlds that
run used, while the developer edits. Where the run cannot fork (a thread of its own, a tracer), the keeper
is started afresh when it ends (``python -m pgnb.testing.keeper``) and imports them itself. Either way it
listens on a Unix socket at once. Each later ``pytest --pgnb-keep`` is a thin client: before its collection it hands its
arguments, directory, environment and terminal (its stdin, stdout and stderr, as file descriptors) to the
keeper, which runs ``pytest.main`` on them in its own process with its warm worlds, and answers the exit
status.

- **The code as it is now**: before each run the keeper, and the ranks of every kept world, forget the
  modules of the project's own files (``pgnb.rank.project_code``): the run imports the test files and the
  project under test anew. Installed code stays imported (edit torch or pgnb: stop the keeper).
- **Its user's only**: the socket lies in a folder only its user can open, and the keeper answers only a
  peer of its own uid.
- **Nothing left for long**: it exits after ``idle`` seconds without a run (``pgnb_keep_idle``, default 600),
  stopping its worlds; killed, its worlds' reaper stops their processes (as when any pytest process dies);
  a client killed mid-run interrupts that run (as Ctrl-C would), and the next run finds the world probed or
  replaced. A stale socket (the keeper is gone) is removed by the next client, whose run is a cold one again.
- One run at a time: a client that finds the keeper busy runs in its own process, cold, and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..spec import WorldSpec
    from .worlds import WorldPool

_log = logging.getLogger(__name__)

#: Imported once by the keeper: what a run of a torch test would import and never changes between runs.
PRELOAD = ("torch", "torch.distributed", "torch.testing._internal.common_utils",
           "torch.testing._internal.common_distributed", "torch.testing._internal.distributed.distributed_test",
           "pytest", "pgnb.testing.plugin")
#: pytest warns that the plugins it finds imported (by PRELOAD, or by the run before) cannot have their
#: asserts rewritten: true, and nothing the run can change
SECOND_IMPORT = "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning"
#: The three file descriptors a client hands over: its stdin, stdout and stderr.
FDS = 3
#: A message's length prefix (big-endian unsigned 32 bits).
LENGTH = struct.Struct(">I")

#: The keeper's WorldPool, kept across runs (None outside a keeper).
pool: WorldPool | None = None
#: The project's root this keeper serves (None outside a keeper).
root: str | None = None
#: How many runs this keeper has begun.
runs = 0


def send_message(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = LENGTH.pack(len(data)) + data
    if fds:
        socket.send_fds(conn, [payload], fds)
    else:
        conn.sendall(payload)


def receive_message(conn: socket.socket, fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One message (and up to ``fds`` file descriptors sent with it); raises ``EOFError`` if the peer is gone."""
    received: list[int] = []
    if fds:
        first, received, _flags, _addr = socket.recv_fds(conn, 65536, fds)
    else:
        first = conn.recv(65536)
    if not first:
        raise EOFError("the peer closed the connection")
    buffer = first
    while len(buffer) < LENGTH.size or len(buffer) < LENGTH.size + LENGTH.unpack_from(buffer)[0]:
        more = conn.recv(65536)
        if not more:
            raise EOFError("the peer closed the connection mid-message")
        buffer += more
    (size,) = LENGTH.unpack_from(buffer)
    return json.loads(buffer[LENGTH.size:LENGTH.size + size]), received


class Keeper:
    """The keeper's loop: accept a client, run its pytest, answer, until idle for ``idle`` seconds."""

    def __init__(self, path: str, project: str, idle: float) -> None:
        self.path, self.project, self.idle = path, project, idle

    def serve(self, warm: dict[str, Any]) -> None:
        """Listen at once (a client that comes meanwhile waits in the queue), import what never changes, start
        the worlds the cold run before used, then take runs until idle."""
        global root
        root = self.project
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound = f"{self.path}.{os.getpid()}"
        server.bind(bound)
        server.listen(4)
        if _answers(self.path):  # two cold runs at once each started a keeper: the first one serves
            os.unlink(bound)
            server.close()
            return
        try:
            os.replace(bound, self.path)  # the path appears listening: a client never meets it refusing
            # the worlds start (their zygote importing torch) while this process imports it: two cores busy
            warming = threading.Thread(target=_warm_up, args=(warm,), name="pgnb-keep-warm-up", daemon=True)
            warming.start()
            _preload()
            warming.join()
            while True:
                try:
                    if not select.select([server], [], [], self.idle)[0]:
                        break  # idle
                    conn, _ = server.accept()
                    with conn:
                        if self._peer_uid(conn) == os.getuid():
                            self._serve_one(conn)
                except KeyboardInterrupt:  # a client's Ctrl-C that came as its run ended: nothing to stop
                    continue
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            server.close()
            if pool is not None:
                pool.close()

    @staticmethod
    def _peer_uid(conn: socket.socket) -> int:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[1])

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            request, fds = receive_message(conn, FDS)
        except (EOFError, OSError, ValueError):
            return
        if len(fds) != FDS:
            for fd in fds:
                os.close(fd)
            return
        try:
            status = self._run(conn, request, fds)
        finally:
            for fd in fds:
                os.close(fd)
        with contextlib.suppress(OSError):
            send_message(conn, {"exit": status})

    def _run(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> int:
        import pytest

        global runs
        runs += 1
        running = threading.Event()  # this run's: a watcher left from the run before never interrupts this one
        watcher = threading.Thread(target=_watch, args=(conn, running), name="pgnb-keep-client", daemon=True)
        with _as_client(request, fds):
            forget_project_code(self.project)
            running.set()
            watcher.start()
            try:
                args = list(request["args"])
                return int(pytest.main(["-W", SECOND_IMPORT, *args]))
            except KeyboardInterrupt:
                return int(pytest.ExitCode.INTERRUPTED)
            finally:
                running.clear()


def _watch(conn: socket.socket, running: threading.Event) -> None:
    """The client's Ctrl-C (or its end, killed) interrupts its run, as Ctrl-C would a pytest of its own."""
    try:
        while running.is_set():
            if select.select([conn], [], [], 0.2)[0]:
                conn.recv(64)  # b"interrupt", or b"" when the client is gone: either way, stop the run
                break
        else:
            return
    except OSError:
        pass
    if running.is_set():
        os.kill(os.getpid(), signal.SIGINT)


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def forget_project_code(project: str) -> None:
    """Here and on every kept world's ranks: the project's modules are imported anew by the next run."""
    from ..rank.project_code import forget_project_modules

    forget_project_modules(project)
    if pool is None:
        return
    for sb in pool.worlds().values():
        try:
            sb.execute(f"from pgnb.rank.project_code import forget_project_modules\n"
                       f"forget_project_modules({project!r})\n", timeout=10.0)
        except Exception as e:  # a world that cannot take it is not worth keeping
            _log.debug("forgetting the project's modules on a kept world: %s", e)
            pool.recycle(sb)


@contextlib.contextmanager
def _as_client(request: dict[str, Any], fds: list[int]) -> Iterator[None]:
    """This process takes the client's terminal, directory and environment for one run, then its own back."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(fd) for fd in range(FDS)]
    environ, cwd, argv = dict(os.environ), os.getcwd(), sys.argv
    try:
        for fd, theirs in enumerate(fds):
            os.dup2(theirs, fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [sys.argv[0], *request["args"]]
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, ours in enumerate(saved):
            os.dup2(ours, fd)
            os.close(ours)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.argv = argv


def _end(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pgnb.testing.keeper", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on (its folder: 0700)")
    parser.add_argument("--root", required=True, help="the project's root: its modules are imported anew each run")
    parser.add_argument("--idle", type=float, default=600.0, help="seconds without a run before the keeper exits")
    parser.add_argument("--warm", default="{}", help='JSON: {"worlds": [options, ...], "preload": [module, ...]}')
    args = parser.parse_args(argv)
    os.chdir(args.root)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _end)  # `kill PID`: the worlds stopped and the socket removed, as when idle
    Keeper(args.socket, args.root, args.idle).serve(json.loads(args.warm))


def woken(path: str, project: str, idle: float) -> Callable[[dict[str, Any]], int]:
    """What a keeper forked from the cold run (``pgnb.testing.keep``) does once that run ends and wakes it with
    what it used: serve, as ``main`` would, with nothing left to import. It forgets the project's modules the
    run imported, then forks its worlds' zygotes from itself (torch and the harness in them already)."""

    def serve(warm: dict[str, Any]) -> int:
        from ..core import cluster
        from ..rank.project_code import forget_project_modules

        os.chdir(project)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _end)
        forget_project_modules(project)
        cluster.ZYGOTE_PRELOAD[:] = list(warm.get("preload", []))
        why = cluster.fork_zygotes(len(warm.get("worlds", [])))
        if why:
            _log.warning("zygotes not forked from the kept process (%s): its worlds import torch again", why)
        Keeper(path, project, idle).serve(warm)
        return 0

    return serve


def _preload() -> None:
    """Import what never changes between runs: PRELOAD, and pytest's plugins (the first run would load them)."""
    from importlib.metadata import entry_points

    started = time.monotonic()
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # what is not installed is not needed
            __import__(name)
    for plugin in entry_points(group="pytest11"):
        with contextlib.suppress(Exception):  # pytest says why, when the run loads it
            plugin.load()
    _log.info("imported %s in %.1f s", ", ".join(PRELOAD), time.monotonic() - started)


def _warm_up(warm: dict[str, Any]) -> None:
    """Start the worlds the cold run before used, their zygote importing what its ranks imported."""
    global pool
    if not warm.get("worlds"):
        return
    from ..core import cluster
    from .worlds import WorldPool

    pool = WorldPool()
    cluster.ZYGOTE_PRELOAD[:] = list(warm.get("preload", []))
    for options in warm["worlds"]:
        try:
            pool.get(options)
        except Exception as e:  # the run that asks for it starts it, and says why it cannot
            _log.warning("starting a world for the next run (%s): %s", options, e)
    cluster.ZYGOTE_PRELOAD.clear()


def spec_options(spec: WorldSpec) -> dict[str, Any] | None:
    """The options that make ``spec`` (its non-default fields), as JSON can carry them; None if it cannot."""
    from dataclasses import fields

    options = {f.name: getattr(spec, f.name) for f in fields(spec) if getattr(spec, f.name) != f.default}
    if any(not isinstance(v, (str, int, float, type(None))) for v in options.values()):
        return None  # (a delayed rank: a lesson's world, not a test's)
    return options


if __name__ == "__main__":  # run as pgnb.testing.keeper, the module the plugin reads `root` and `pool` of
    from pgnb.testing.keeper import main as keeper_main

    keeper_main()
