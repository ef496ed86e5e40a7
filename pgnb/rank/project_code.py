"""A kept process sees the user's edits: the modules of the project's own files are forgotten between runs.

``pytest --pgnb-keep`` runs pytest again and again in one process (``pgnb.testing.keeper``) on the same
ranks. What does not change between two runs stays imported there (torch, torch's test harness, pytest,
pgnb, anything installed); the modules whose files lie under the project's root (the test files, their
conftests and helpers, the project under test when it is not installed) are dropped from ``sys.modules``
before each run, so the run imports them again from the files as they are now. Nothing is reloaded in
place: a module imported anew is a new module, as in a fresh process.
"""

from __future__ import annotations

import importlib
import os
import sys

#: Folders whose modules are installed code, never the project's own, even under its root (a venv there).
INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def forget_project_modules(root: str) -> list[str]:
    """Drop from ``sys.modules`` every module whose file lies under ``root`` (but pgnb's own and installed
    packages); the names dropped."""
    root = os.path.join(os.path.realpath(root), "")
    own = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")
    dropped = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        real = os.path.realpath(path)
        if real.startswith(root) and not real.startswith(own) and not any(part in real for part in INSTALLED):
            del sys.modules[name]
            dropped.append(name)
    testing = sys.modules.get(f"{__package__}.testing")  # loaded where world tests ran: their own imports
    if testing is not None:
        for name in dropped:
            testing.forget_loaded(name)
    importlib.invalidate_caches()  # a file added since the last run is found
    return dropped
