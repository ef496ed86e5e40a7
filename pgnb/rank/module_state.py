"""What a fresh process would find in a test's modules: their globals and class attributes, put back.

torch's harnesses run a test (``MultiProcessTestCase``) or a test class
(``MultiProcContinuousTest``) in processes that end with it, so a module global
a test changes dies with them: torch's ``DistributedTest`` counts its file
barriers in a class attribute (``Barrier.barrier_id``), and a warm rank that kept
the count of its last test would wait at the next test's first barrier for a
peer that counts from 0. A warm rank takes a snapshot of each watched module the
first time it sees it (its globals, and the attributes of the classes it
defines) and puts back whatever was rebound, added or deleted since: the test's
own module, the modules of its class's bases, and torch's test harness
(``torch.testing._internal``). What a test changes inside a mutable object
(a list it appends to) is not seen here.
"""

from __future__ import annotations

import sys
import types
from typing import Any

#: The packages whose modules are watched besides the test's own (torch's test harness).
WATCHED = ("torch.testing._internal.",)
#: Class attributes that are Python's, not the class's state.
_OWN = frozenset({"__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__"})

# module name -> (its module, {global: value}, {class: {attribute: value}})
_SNAPSHOTS: dict[str, tuple[types.ModuleType, dict[str, Any], dict[type, dict[str, Any]]]] = {}


def watched(names: list[str]) -> list[types.ModuleType]:
    """These modules (the loaded ones) and every loaded module of torch's test harness."""
    found = {name: sys.modules[name] for name in names if name in sys.modules}
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(WATCHED):
            found.setdefault(name, module)
    return list(found.values())


def remember(modules: list[types.ModuleType]) -> None:
    """Take a module's snapshot the first time it is seen (a module imported again gets a new one)."""
    for module in modules:
        kept = _SNAPSHOTS.get(module.__name__)
        if kept is not None and kept[0] is module:
            continue
        classes = {obj: _class_state(obj) for obj in list(vars(module).values())
                   if isinstance(obj, type) and obj.__module__ == module.__name__}
        _SNAPSHOTS[module.__name__] = (module, dict(vars(module)), classes)


def restore() -> list[str]:
    """Put every remembered module back as it was when first seen; the names that had changed."""
    changed: list[str] = []
    for name, (module, globals_, classes) in list(_SNAPSHOTS.items()):
        if sys.modules.get(name) is not module:
            del _SNAPSHOTS[name]  # unloaded or imported anew: its next snapshot is taken when it is seen
            continue
        changed += [f"{name}.{k}" for k in _put_back(module, vars(module), globals_)]
        for cls, state in classes.items():
            changed += [f"{name}.{cls.__qualname__}.{k}" for k in _put_back(cls, cls.__dict__, state)]
    return changed


def _class_state(cls: type) -> dict[str, Any]:
    return {k: v for k, v in cls.__dict__.items() if k not in _OWN}


def _put_back(owner: Any, now: Any, then: dict[str, Any]) -> list[str]:
    changed = []
    for key in [k for k in list(now) if k not in _OWN and (k not in then or now[k] is not then[k])]:
        changed.append(key)
        try:
            if key in then:
                setattr(owner, key, then[key])
            else:
                delattr(owner, key)
        except (AttributeError, TypeError):  # a read-only attribute: it stays as the test left it
            pass
    for key in [k for k in then if k not in now]:
        changed.append(key)
        try:
            setattr(owner, key, then[key])
        except (AttributeError, TypeError):
            pass
    return changed
