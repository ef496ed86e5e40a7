"""Every private name pgnb takes from torch, ipyparallel and the rest is in the installed versions.

``pgnb/_private_names.py`` lists them, each with what pgnb does without it. Here each one is
looked up in the installed package: a release that renamed or moved one fails its own test,
naming the name and the version (in ``make test``, and in each column of the support matrix,
``make matrix``). Also: pgnb uses no private name of these packages that is not listed, the
list says where each is used, and ``require`` refuses a feature in one line when a name it
cannot do without is gone.
"""

from __future__ import annotations

import ast
import re
from importlib.util import find_spec
from pathlib import Path

import pytest

from pgnb import _private_names as private
from pgnb._private_names import NAMES, PrivateName

pytest_plugins = ["pytester"]

PKG = Path(__file__).resolve().parent.parent / "pgnb"
#: Private-looking names pgnb uses that belong to no package listed: the standard library's,
#: pgnb's own, and a public protocol.
NOT_BORROWED = {
    "_current_frames": "sys",
    "_getframe": "sys",
    "_exit": "os",
    "_Environ": "os",
    "_run_exitfuncs": "atexit",
    "_clear": "atexit",
    "_registry": "weakref",
    "_spawn_engine": "pgnb.procs.zygote's own",
    "_dispatch": "pgnb.core.sandbox's own",
    "_pgnb_bridge": "pgnb.debugger's own attribute on the kernel",
    "_repr_mimebundle_": "IPython's public display protocol",
    "_dynamo": "torch._dynamo is only looked for in sys.modules, never imported or called",
}
#: Module prefixes whose private names the scan below looks for in pgnb's strings.
PACKAGES = ("torch.", "ipyparallel.", "_pytest.", "IPython.", "ipykernel.")


def _import_name(entry: PrivateName) -> str:
    return entry.package.replace("-", "_")


@pytest.mark.parametrize("entry", NAMES, ids=[e.name for e in NAMES])
def test_private_name_is_where_pgnb_expects_it(entry: PrivateName) -> None:
    if find_spec(_import_name(entry)) is None:
        pytest.skip(f"{entry.package} is not installed (an optional package of pgnb's)")
    why = private.problem(entry)
    assert why is None, private.message(entry, why)


def _borrowed_parts() -> set[str]:
    return {part for e in NAMES for part in re.split(r"[:./]", e.name) if part.startswith("_")}


def _used_private_names() -> dict[str, set[str]]:
    """Every private-looking name in pgnb/: attributes of anything but self/cls, getattr-family string
    names, private parts of imported modules and of module names in strings -> the files using it."""
    found: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "_private_names.py":
            continue
        where = str(path.relative_to(PKG))
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name)
                                                        and node.value.id == "self"):
                names.append(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                names.append(node.args[1].value)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.extend(node.module.split("."))
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                names.extend(part for a in node.names for part in a.name.split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.startswith(PACKAGES) and " " not in node.value:
                names.extend(node.value.split("."))
        for name in names:
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                found.setdefault(name, set()).add(where)
    return found


def test_every_private_name_pgnb_uses_is_listed() -> None:
    """A new private name of torch's (or ipyparallel's, ...) goes into pgnb/_private_names.py, with what
    pgnb does without it; pgnb's own underscored names of other modules count too (they are few)."""
    listed = _borrowed_parts()
    unlisted = {name: sorted(files) for name, files in _used_private_names().items()
                if name not in listed and name not in NOT_BORROWED}
    # pgnb's own modules' private names (a module imported across pgnb/) are not borrowed
    own = {name for name in unlisted if (PKG / f"{name}.py").exists() or any(PKG.rglob(f"{name}.py"))}
    unlisted = {k: v for k, v in unlisted.items() if k not in own}
    assert not unlisted, (f"private names used in pgnb/ but not listed in pgnb/_private_names.py "
                          f"(add each, with what pgnb does without it): {unlisted}")


@pytest.mark.parametrize("entry", [e for e in NAMES if not e.name.startswith("file:")], ids=lambda e: e.name)
def test_the_list_says_where_each_name_is_used(entry: PrivateName) -> None:
    text = (PKG / entry.where).read_text()
    assert entry.attribute in text, f"{entry.name} is not used in pgnb/{entry.where} (update the list)"


def test_a_moved_name_is_named_with_its_version() -> None:
    gone = PrivateName("torch", "torch.distributed.rendezvous:_create_c10d_store_renamed", "rendezvous",
                       "rank/rendezvous.py", private.ERROR)
    why = private.problem(gone)
    assert why is not None and "_create_c10d_store_renamed" in why, why
    line = private.message(gone, why)
    version = private.installed_version("torch")
    assert f"torch's private torch.distributed.rendezvous._create_c10d_store_renamed, which torch {version}" in line
    assert "\n" not in line and "docs/supported_versions.md" in line, line
    missing_module = PrivateName("ipyparallel", "ipyparallel.no_such_module:Client", "cells", "core/sending.py",
                                 private.ERROR)
    assert "ModuleNotFoundError" in (private.problem(missing_module) or ""), private.problem(missing_module)
    assert private.problem(PrivateName("torch", "file:distributed/no_such_file.py", "trace", "rank/trace.py",
                                       "")) == "no such file"
    moved_in_source = PrivateName("ipyparallel", "ipyparallel.client.client:Client._no_such_stream", "cells",
                                  "core/sending.py", "", in_source=True)
    assert private.problem(moved_in_source) == "ipyparallel.client.client no longer uses ._no_such_stream"


def test_require_refuses_a_feature_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    private.require("trace")  # every name the trace cannot do without is here
    gone = PrivateName("torch", "torch:_C._len_torch_dispatch_stack_renamed", "trace", "rank/trace.py",
                       private.ERROR)
    monkeypatch.setattr(private, "NAMES", (*NAMES, gone))
    private.require.cache_clear()
    try:
        with pytest.raises(private.PrivateNameMoved) as e:
            private.require("trace")
        text = str(e.value)
        assert "\n" not in text and "pgnb's trace relies on torch's private torch._C." in text, text
        assert f"torch {private.installed_version('torch')} changed" in text, text
    finally:
        private.require.cache_clear()


def test_a_traced_cell_is_refused_before_anything_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a rank, ``%%pg --trace`` checks its names first: one line, and torch.distributed left as it was."""
    import torch.distributed as dist

    from pgnb.rank import trace

    gone = PrivateName("torch", "torch:_C._pop_torch_dispatch_stack_renamed", "trace", "rank/trace.py",
                       private.ERROR)
    monkeypatch.setattr(private, "NAMES", (*NAMES, gone))
    private.require.cache_clear()
    before = dist.all_reduce
    try:
        with pytest.raises(private.PrivateNameMoved, match=r"_pop_torch_dispatch_stack_renamed, which torch "):
            trace.start(None, "refused")
        assert dist.all_reduce is before and trace.active_modes() == 0
    finally:
        trace.stop()
        private.require.cache_clear()


SUITE = '''
from torch.testing._internal.common_distributed import MultiProcessTestCase


class TestTiny(MultiProcessTestCase):
    def test_never_runs(self):
        pass
'''
CONFTEST = '''
from pgnb import _private_names as private

private.NAMES = (*private.NAMES, private.PrivateName(
    "torch", "torch.testing._internal.common_distributed:MultiProcessTestCase._run_renamed", "torch_suites",
    "rank/torch_suites.py", private.ERROR))
'''


def test_pgnb_torch_is_refused_in_one_line(pytester: pytest.Pytester) -> None:
    """``pytest --pgnb-torch`` on a torch that moved a name of its harness: pytest's one-line usage error,
    before any world starts."""
    pytester.makepyfile(test_tiny=SUITE)
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgnb-torch", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    assert len(errors) == 1 and "MultiProcessTestCase._run_renamed, which torch " in errors[0], result.stderr.str()
