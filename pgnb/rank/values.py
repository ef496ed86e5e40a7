"""Values in and out of a rank's namespace: ``Sandbox.push`` / ``pull`` and what ``%pg_show`` sees.

Runs on the ranks, sent by reference; imports nothing heavy at the top
(torch and numpy are only looked up in ``sys.modules``: a rank that never
imported numpy has no numpy values).
"""

from __future__ import annotations

import sys
from typing import Any

from .._wire import ValueSummary

#: Elements of a tensor ``%pg_show`` sends per rank (the rest is counted, not sent).
MAX_ELEMENTS = 16
#: Characters of a string or another object's repr shown per rank.
MAX_TEXT = 60


def summarize(value: Any, limit: int = MAX_ELEMENTS) -> ValueSummary:
    """What the view needs of one rank's value: kind, type text, the first ``limit`` elements."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)[:limit].cpu()
        dtype = str(value.dtype).replace("torch.", "")
        return {"kind": "tensor", "dtype": dtype, "shape": list(value.shape), "numel": value.numel(),
                "head": _plain(flat.tolist()), "device": value.device.type}
    if np is not None and isinstance(value, np.ndarray):
        return {"kind": "tensor", "dtype": f"numpy {value.dtype}", "shape": list(value.shape), "numel": int(value.size),
                "head": _plain(value.reshape(-1)[:limit].tolist()), "device": "cpu"}
    if np is not None and isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return {"kind": "scalar", "type": type(value).__name__, "value": value}
    if isinstance(value, str):
        return {"kind": "text", "type": "str", "value": value[:MAX_TEXT], "cut": len(value) > MAX_TEXT}
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (bool, int, float)) for v in value):
        return {"kind": "tensor", "dtype": type(value).__name__, "shape": [len(value)], "numel": len(value),
                "head": list(value[:limit]), "device": "cpu"}
    text = repr(value)
    return {"kind": "text", "type": type(value).__name__, "value": text[:MAX_TEXT], "cut": len(text) > MAX_TEXT}


def _plain(values: list[Any]) -> list[Any]:
    return [v if isinstance(v, (bool, int, float)) else str(v) for v in values]


def fetch(name: str, limit: int = MAX_ELEMENTS) -> ValueSummary:
    """On a rank: ``summarize`` the variable ``name`` of the rank's namespace (or say it is missing)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if name not in ns:
        return {"kind": "missing"}
    return summarize(ns[name], limit)


def push_values(values: dict[str, Any]) -> None:
    """``Sandbox.push``: put the values into this rank's namespace, as cells see it."""
    from IPython import get_ipython

    get_ipython().user_ns.update(values)


def pull_value(name: str) -> Any:
    """``Sandbox.pull``: this rank's value of ``name`` (tensors come back on the CPU)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if name not in ns:
        raise NameError(f"name {name!r} is not defined on this rank")
    return to_cpu(ns[name], 3)


def to_cpu(value: Any, depth: int) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if depth <= 0:
        return value
    if type(value) in (list, tuple):
        return type(value)(to_cpu(v, depth - 1) for v in value)
    if type(value) is dict:
        return {k: to_cpu(v, depth - 1) for k, v in value.items()}
    return value
