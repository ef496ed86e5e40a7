"""JupyterLab's Debugger panel reaching the ranks of ``%%pg`` cells (a face beside ``notebook/`` and ``testing/``).

``install(shell)`` gives the kernel's debug requests to a ``Bridge`` (``bridge.py``),
which answers what concerns a rank and leaves the rest to ipykernel's debugger;
``link.py`` is one rank's Debug Adapter Protocol connection; ``breakpoints.py``
the panel's breakpoints the ranks get; ``ids.py`` the ids Lab sees for ranks'
threads, frames and variables.
"""

from __future__ import annotations

from typing import Any

from .bridge import Bridge


def install(shell: Any) -> Bridge | None:
    """Bridge the kernel's debugger to the ranks; None where there is no kernel with a debugger (a terminal,
    a bare shell, a kernel without debugpy). Installing twice keeps the first bridge."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None or getattr(kernel, "debugger", None) is None or not hasattr(kernel, "do_debug_request"):
        return None
    found = getattr(kernel, "_pgnb_bridge", None)
    if isinstance(found, Bridge):
        return found
    bridge = kernel._pgnb_bridge = Bridge(kernel, shell)
    return bridge
