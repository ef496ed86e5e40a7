"""ipyparallel's SSH engine-set launcher (``--launcher ssh``): its engines started at once, stopped quietly.

Unchanged but for three things. Each engine's start (some five ssh round trips: the
shell, the python, the remote profile, the connection file, the engine) runs in a
thread of its own, all at once: ipyparallel's goes through them engine by engine.
Its ssh commands' stderr is kept from the kernel's: a signal to an engine that has
died already raises ``ProcessLookupError`` on the remote host, and ssh hands that
traceback to the kernel's stderr, which a notebook shows (and nbval compares); it
is logged at debug level instead. And a
stop signals every engine at once: ipyparallel's sends each engine's SIGTERM
over ssh one after the other, from its event loop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import threading
from typing import Any

from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher
from ipyparallel.cluster.shellcmd import ShellCommandSend

_log = logging.getLogger("pgnb")


class _QuietSend(ShellCommandSend):  # type: ignore[misc]  # ipyparallel is untyped
    def _check_output(self, cmd: list[str], **kwargs: Any) -> Any:
        kwargs.setdefault("stderr", subprocess.PIPE)  # on the CalledProcessError, which the launcher logs
        return super()._check_output(cmd, **kwargs)


class QuietSSHEngineLauncher(SSHEngineLauncher):  # type: ignore[misc]
    """One engine on a host reached by ssh."""

    @property
    def ssh_sender(self) -> ShellCommandSend:
        sender: ShellCommandSend | None = getattr(self, "_ssh_sender", None)  # ipyparallel's own cache
        if sender is None:
            sender = self._ssh_sender = _QuietSend(self.ssh_cmd, [*self.ssh_args, self.location],
                                                   self.remote_python, log=self.log)
        return sender

    _starting: threading.Thread | None = None
    _start_error: BaseException | None = None

    def start(self, hostname: str | None = None, user: str | None = None, port: int | None = None) -> None:
        """Begin the start in a thread (``wait_started`` ends it)."""
        self.loop  # noqa: B018  # on this thread: ipyparallel's waiting thread needs the caller's loop

        def run() -> None:
            try:
                super(QuietSSHEngineLauncher, self).start(hostname=hostname, user=user, port=port)
            except BaseException as e:  # raised by wait_started, on the caller's thread
                self._start_error = e

        self._starting = threading.Thread(target=run, name=f"pgnb-ssh-start-{hostname}", daemon=True)
        self._starting.start()

    def wait_started(self) -> None:
        if self._starting is not None:
            self._starting.join()
        if self._start_error is not None:
            raise self._start_error

    async def _signal(self, sig: int) -> None:
        try:  # ssh, in a thread: the engines of a set are signalled at once
            await asyncio.get_running_loop().run_in_executor(None, self.signal, sig)
        except Exception as e:  # gone already
            _log.debug("signal %d to %s pid %s: %s", sig, self.location, self.pid, e)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_seconds_until_kill`` (as ipyparallel's stop)."""
        await self._signal(signal.SIGTERM)
        try:
            await self.join(timeout=self.stop_seconds_until_kill)
            return
        except TimeoutError:
            pass
        await self._signal(signal.SIGKILL)
        await self.join(timeout=self.stop_timeout)


class QuietSSHEngineSetLauncher(SSHEngineSetLauncher):  # type: ignore[misc]
    """``c.SSHEngineSetLauncher.*`` in the profile applies (a subclass reads its parent's section)."""

    entrypoint_name = "ssh"  # what the cluster file and `ipcluster` call it
    launcher_class = QuietSSHEngineLauncher

    def start(self, n: int) -> Any:
        started = super().start(n)  # each engine's start begun
        for el in list(self.launchers.values()):
            el.wait_started()
        return started
