"""A stand-in for pgnb's magics and status view, to check the browser harness alone.

Selected with ``PGNB_BROWSER_EXTENSION=standin_pgnb``. It keeps the DOM
contract the browser test checks (``pgnb-view``, ``pgnb-header``,
``pgnb-row``/``pgnb-rank-{r}``, ``pgnb-state``, ``pgnb-refresh``,
``pgnb-shutdown``) and the magics' names, and fakes ranks with threads.
It starts ``world`` idle ``sleep`` processes marked ``PGNB_OWNER`` and stops
them on ``%pg_shutdown``, so the leftover-process check has something to see.
No torch, no engines: a harness failure with it is the harness's fault.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from typing import Any

import ipywidgets as W
from IPython.display import display

_CURRENT: _Sandbox | None = None


class _Ranks:
    """What ``client[:]`` is for the test: a way to act on the ranks behind the view's back."""

    def __init__(self, sb: _Sandbox) -> None:
        self._sb = sb

    def apply_sync(self, fn: Any, *args: Any) -> list[None]:
        # The stand-in cannot run fn on ranks; it does what the test's fn does.
        for r in range(self._sb.world):
            if self._sb.truth[r] == "initialized":
                self._sb.truth[r] = "destroyed"
        return [None] * self._sb.world


class _Client:
    def __init__(self, sb: _Sandbox) -> None:
        self._sb = sb

    def __getitem__(self, key: Any) -> _Ranks:
        return _Ranks(self._sb)


class _Sandbox:
    def __init__(self, backend: str, world: int, delays: dict[int, float]) -> None:
        self.backend, self.world, self.delays = backend, world, delays
        self.truth = ["starting"] * world
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client = _Client(self)
        self.view = _View(self)

    def start(self) -> None:
        if not self.procs:
            env = dict(os.environ, PGNB_OWNER=str(os.getpid()))
            cmd = [sys.executable, "-c", "import time; time.sleep(600)"]
            self.procs = [subprocess.Popen(cmd, env=env, start_new_session=True) for _ in range(self.world)]
        self._set(["starting"] * self.world)
        time.sleep(0.8)
        self._set(["pending"] * self.world)
        t0 = time.monotonic()
        order = sorted(range(self.world), key=lambda r: self.delays.get(r, 0.0))
        for r in order:
            time.sleep(max(0.0, self.delays.get(r, 0.0) - (time.monotonic() - t0)) + 0.1)
            self.truth[r] = "initialized"
            self.view.render()

    def destroy(self) -> None:
        self._set(["destroyed"] * self.world)

    def shutdown(self) -> None:
        self.destroy()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=10)
        self.procs = []

    def _set(self, states: list[str]) -> None:
        self.truth = list(states)
        self.view.render()


class _View:
    def __init__(self, sb: _Sandbox) -> None:
        self.sb = sb
        self.header = W.HTML().add_class("pgnb-header")
        self.states = [W.HTML().add_class("pgnb-state") for _ in range(sb.world)]
        rows = [
            W.HBox([W.HTML(f"<b>{r}</b>"), W.HTML("127.0.0.1"), self.states[r]])
            .add_class("pgnb-row")
            .add_class(f"pgnb-rank-{r}")
            for r in range(sb.world)
        ]
        refresh = W.Button(description="refresh").add_class("pgnb-refresh")
        stop = W.Button(description="shutdown").add_class("pgnb-shutdown")
        refresh.on_click(lambda _b: self.render())
        stop.on_click(lambda _b: sb.shutdown())
        self.widget = W.VBox([self.header, *rows, W.HBox([refresh, stop])]).add_class("pgnb-view")
        self.render()

    def render(self) -> None:
        sb = self.sb
        with self.widget.hold_sync():
            k = sb.truth.count("initialized")
            self.header.value = f"<b>pgnb</b> {sb.backend} · world {sb.world} · {k}/{sb.world} initialized"
            for html, state in zip(self.states, sb.truth, strict=True):
                html.value = state


def current() -> _Sandbox | None:
    return _CURRENT


def _pg_init(line: str) -> None:
    global _CURRENT
    ap = argparse.ArgumentParser(prog="%pg_init")
    ap.add_argument("--backend", "-b", default="gloo")
    ap.add_argument("--world", "-n", type=int, default=2)
    ap.add_argument("--delay-rank", default="")
    args = ap.parse_args(shlex.split(line))
    delays = {int(r): float(s) for r, s in (c.split(":") for c in args.delay_rank.split(",") if c)}
    if _CURRENT is None:
        _CURRENT = _Sandbox(args.backend, args.world, delays)
    display(_CURRENT.view.widget)  # type: ignore[no-untyped-call]
    _CURRENT.start()


def _pg_destroy(line: str) -> None:
    if _CURRENT is not None:
        _CURRENT.destroy()


def _pg_shutdown(line: str) -> None:
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.shutdown()
        _CURRENT = None


def load_ipython_extension(ip: Any) -> None:
    ip.register_magic_function(_pg_init, "line", "pg_init")
    ip.register_magic_function(_pg_destroy, "line", "pg_destroy")
    ip.register_magic_function(_pg_shutdown, "line", "pg_shutdown")
