"""Files and directories pgnb makes: private (0600 / 0700), and removed by pgnb."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile


def private_file(path: str) -> str:
    """Create ``path`` empty and 0600 if missing; its directory 0700 if missing.

    A writer that opens it later keeps the mode (torch's FileStore and
    ipyparallel's cluster file would make theirs 0644).
    """
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    os.chmod(path, 0o600)
    return path


#: the longest path a Unix socket's address may have (``sun_path``: 108 bytes on Linux, with its NUL)
MAX_SOCKET_PATH = 107
#: the longest name pgnb gives a socket in a folder of its own (``stacks-<pid>.sock``, ``debug-<8 hex>.sock``)
LONGEST_SOCKET_NAME = len("stacks-4194304.sock")


def socket_base(prefix: str) -> str | None:
    """Where to make a folder of pgnb's that holds Unix sockets: None (the temporary folder) unless a socket's
    path there would be too long for one (a long ``TMPDIR``, as a test runner's or a batch job's): ``/tmp``."""
    longest = os.path.join(tempfile.gettempdir(), prefix + "x" * 8, "x" * LONGEST_SOCKET_NAME)  # mkdtemp adds 8
    return "/tmp" if len(longest) > MAX_SOCKET_PATH and os.path.isdir("/tmp") else None


class OwnedDir:
    """A 0700 temp directory pgnb made and removes (file:// stores, stack dumps, trace files); ``sockets``: one
    that holds Unix sockets too, made where their paths fit (``socket_base``)."""

    def __init__(self, prefix: str = "pgnb-", sockets: bool = False) -> None:
        self.path = tempfile.mkdtemp(prefix=prefix, dir=socket_base(prefix) if sockets else None)  # 0700
        os.chmod(self.path, 0o700)

    def private_file(self, name: str) -> str:
        """Create ``name`` in the directory, empty and 0600."""
        return private_file(os.path.join(self.path, name))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
