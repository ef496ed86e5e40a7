"""Values in and out of a rank's namespace: ``Sandbox.push`` / ``pull`` and what ``%pg_show`` sees.

Runs on the ranks, sent by reference; imports nothing heavy at the top
(torch and numpy are only looked up in ``sys.modules``: a rank that never
imported numpy has no numpy values).
"""

from __future__ import annotations

import sys
from typing import Any

from .._wire import DTensorFacts, ParamSummary, ValueSummary

#: Elements of a tensor ``%pg_show`` sends per rank (the rest is counted, not sent).
MAX_ELEMENTS = 16
#: Characters of a string or another object's repr shown per rank.
MAX_TEXT = 60
#: Parameters of a module ``%pg_show`` sends per rank (the rest is counted).
MAX_PARAMS = 64


def summarize(value: Any, limit: int = MAX_ELEMENTS) -> ValueSummary:
    """What the view needs of one rank's value: kind, type text, the first ``limit`` elements.

    A DTensor is its local shard (dtype, shape, head) plus ``dtensor``: the mesh,
    the placements, the global shape and where the shard starts. A module
    (``torch.nn.Module``) is its parameters' global and local shapes.
    """
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        facts = _dtensor(value)
        local = value if facts is None else _local(value)
        with torch.no_grad():
            flat = local.detach().reshape(-1)[:limit].cpu()
        out: ValueSummary = {"kind": "tensor", "dtype": _dtype(value.dtype), "shape": list(local.shape),
                             "numel": local.numel(), "head": _plain(flat.tolist()), "device": local.device.type}
        if facts is not None:
            out["dtensor"] = facts
        return out
    if torch is not None and isinstance(value, torch.nn.Module):
        params: list[ParamSummary] = []
        named = list(value.named_parameters())
        for name, p in named[:MAX_PARAMS]:
            facts = _dtensor(p)
            params.append({"name": name, "dtype": _dtype(p.dtype), "shape": list(p.shape),
                           "local": list(p.shape if facts is None else _local(p).shape),
                           "placements": None if facts is None else facts["placements"],
                           "mesh": None if facts is None else facts["mesh"]})
        return {"kind": "module", "type": type(value).__name__, "params": params,
                "more": max(0, len(named) - MAX_PARAMS)}
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


def _dtype(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _is_dtensor(value: Any) -> bool:
    """``value`` is a DTensor (never imported here: a rank that has not imported it has none)."""
    cls = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return cls is not None and isinstance(value, cls)


def _dtensor(value: Any) -> DTensorFacts | None:
    """The mesh and placements of a DTensor (None for any other tensor)."""
    if not _is_dtensor(value):
        return None
    mesh = value.device_mesh
    placements = tuple(value.placements)
    offset: list[int] | None = None
    try:  # private in torch 2.13; without it the view only lacks the shard's slice
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        offset = [int(x) for x in compute_local_shape_and_global_offset(value.shape, mesh, placements)[1]]
    except Exception:
        offset = None
    return {"shape": list(value.shape), "mesh": mesh.mesh.tolist(),
            "dims": None if mesh.mesh_dim_names is None else list(mesh.mesh_dim_names),
            "placements": [placement_text(p) for p in placements], "offset": offset}


def _local(value: Any) -> Any:
    """A DTensor's local shard, without recording an autograd step."""
    local = getattr(value, "_local_tensor", None)
    return local if local is not None else value.to_local()


def placement_text(placement: Any) -> str:
    """``Shard(0)``, ``Replicate()``, ``Partial(sum)``: torch's own text, without ``dim=``."""
    return repr(placement).replace("dim=", "")


def _plain(values: list[Any]) -> list[Any]:
    return [v if isinstance(v, (bool, int, float)) else str(v) for v in values]


def fetch(name: str, limit: int = MAX_ELEMENTS) -> ValueSummary:
    """On a rank: ``summarize`` the variable ``name`` of the rank's namespace (or say it is missing)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if name not in ns:
        return {"kind": "missing"}
    return summarize(ns[name], limit)


def clear_namespace() -> None:
    """A world of a new size: every name the rank's cells defined is dropped, as in a fresh kernel.

    IPython's own names (``In``, ``exit``, ...) and those beginning with ``_`` are kept: an
    engine's running request keeps its function and arguments under such names. Freed now, while
    the old group is alive: torch 2.13 can hang freeing a DDP model after ``destroy_process_group()``.
    """
    import gc

    from IPython import get_ipython

    shell = get_ipython()
    hidden = shell.user_ns_hidden
    for name in [n for n in shell.user_ns if n not in hidden and not n.startswith("_")]:
        del shell.user_ns[name]
    gc.collect()


def push_values(values: dict[str, Any]) -> None:
    """``Sandbox.push``: put the values into this rank's namespace, as cells see it."""
    from IPython import get_ipython

    get_ipython().user_ns.update(values)


def pull_value(name: str) -> Any:
    """``Sandbox.pull``: this rank's value of ``name`` (tensors come back on the CPU, a DTensor as its local shard)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if name not in ns:
        raise NameError(f"name {name!r} is not defined on this rank")
    return to_cpu(ns[name], 3)


def to_cpu(value: Any, depth: int) -> Any:
    """``value`` as the kernel can use it: tensors on the CPU, down to ``depth`` levels of lists, tuples, dicts.

    A DTensor becomes its local shard, a plain tensor: the DTensor itself would need this rank's
    process group wherever it is used (the kernel has none), and the local shard needs no
    collective, so every rank's copy arrives even when only some ranks are asked.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if _is_dtensor(value):
            local = _local(value).detach()
            value = local.requires_grad_() if value.requires_grad else local
        return value.detach().cpu() if value.device.type != "cpu" else value
    if depth <= 0:
        return value
    if type(value) in (list, tuple):
        return type(value)(to_cpu(v, depth - 1) for v in value)
    if type(value) is dict:
        return {k: to_cpu(v, depth - 1) for k, v in value.items()}
    return value
