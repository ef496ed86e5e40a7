"""A rank's ``sys.stdout``/``sys.stderr``: what Python writes, never the process's file descriptors.

ipykernel's ``OutStream`` also forwards writes to fd 1/2 (C++ logs of torch and gloo,
a C extension's ``printf``) unless ``PYTEST_CURRENT_TEST`` is set. A rank's cell
output would then depend on where the kernel runs: JupyterLab shows those lines,
nbval (under pytest) does not, so a notebook saved in JupyterLab could not replay.
pgnb's engines never forward them; they stay in the engine's log file.

What a rank writes never names the engine's temporary cell files
(``/tmp/ipykernel_<pid>/<hash>.py``, a new directory every run): they read
``Cell, line N``, as in pgnb's tracebacks, and a warning says where it was
raised the way a traceback frame does (``format_warning``).
"""

from __future__ import annotations

import re
from typing import Any

from ipykernel.iostream import OutStream

#: A cell's source file on an engine (or on the kernel, for a function sent from the notebook), with its line.
_CELL_FILE = re.compile(r"(?:[^\s\"'<>:]*/)?ipykernel_\d+/\d+\.py(?::(\d+))?")


def without_cell_files(text: str) -> str:
    """``text`` with each cell file's path as ``Cell`` (``path:3`` as ``Cell, line 3``)."""
    if "ipykernel_" not in text:  # the common case, at the cost of one scan
        return text
    return _CELL_FILE.sub(lambda m: f"Cell, line {m[1]}" if m[1] else "Cell", text)


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: str | None = None) -> str:
    """``warnings.formatwarning`` on a rank: ``Cell, line 3: UserWarning: ...`` and the cell's line, or a library
    file from its package down without a line number (as tracebacks show library frames; both differ by install)."""
    from .cell import short_path

    name = getattr(category, "__name__", str(category))
    if _CELL_FILE.fullmatch(filename):
        import linecache

        source = (line if line is not None else linecache.getline(filename, lineno)).strip()
        return f"Cell, line {lineno}: {name}: {message}\n" + (f"  {source}\n" if source else "")
    return f"{short_path(filename)}: {name}: {message}\n"


class PythonOutStream(OutStream):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["watchfd"] = False
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def write(self, string: str) -> int:
        # anything else than a str: OutStream says what is wrong with it
        super().write(without_cell_files(string) if isinstance(string, str) else string)
        return len(string)
