"""A rank's ``sys.stdout``/``sys.stderr``: what Python writes, never the process's file descriptors.

ipykernel's ``OutStream`` also forwards writes to fd 1/2 (C++ logs of torch and gloo,
a C extension's ``printf``) unless ``PYTEST_CURRENT_TEST`` is set. A rank's cell
output would then depend on where the kernel runs: JupyterLab shows those lines,
nbval (under pytest) does not, so a notebook saved in JupyterLab could not replay.
pgnb's engines never forward them; they stay in the engine's log file.
"""

from __future__ import annotations

from typing import Any

from ipykernel.iostream import OutStream


class PythonOutStream(OutStream):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["watchfd"] = False
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
