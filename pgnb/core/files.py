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


class OwnedDir:
    """A 0700 temp directory pgnb made and removes (file:// stores, stack dumps, trace files)."""

    def __init__(self, prefix: str = "pgnb-") -> None:
        self.path = tempfile.mkdtemp(prefix=prefix)  # mkdtemp makes it 0700
        os.chmod(self.path, 0o700)

    def private_file(self, name: str) -> str:
        """Create ``name`` in the directory, empty and 0600."""
        return private_file(os.path.join(self.path, name))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
