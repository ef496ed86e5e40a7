"""Every private name of another package's that pgnb relies on, and what pgnb does without it.

pgnb reaches into torch (its c10d store factory, the dispatch-mode stack, the harness
of its own distributed tests), ipyparallel (the Client's send path, its launchers'
hooks), and a few of IPython's, ipykernel's and pytest's. A release may rename any of
them without notice. Each is listed here once, with the feature that uses it and what
that feature does when it is gone: a fallback (the feature works, with less), or a
one-line error naming the name and the installed version (``require``).
``tests/test_private_names.py`` looks up every one in the installed packages, so a
release that moved one fails there, by name and version, in the support matrix
(docs/supported_versions.md); ``tests/test_private_names.py`` also checks that no
other private name of these packages is used anywhere in ``pgnb/``.

Standard library only: the kernel side, the ranks and the pytest plugin all import it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

Package = Literal["torch", "ipyparallel", "IPython", "ipykernel", "ipywidgets", "pytest", "pytest-cov", "accelerate"]

#: where pgnb's supported versions are listed (the matrix that tests them)
SUPPORTED = "docs/supported_versions.md"


@dataclass(frozen=True)
class PrivateName:
    """One private name of ``package``'s.

    ``name``: ``module:attr.attr`` (looked up as written), ``module:Class.attr`` with ``in_source``
    (an attribute set on instances: the class must exist and its module must still use ``.attr``), or
    ``file:path`` (a file of the package that pgnb's stack reading recognises by its path).
    ``feature``: what pgnb uses it for; ``where``: pgnb's module that uses it; ``without``: what
    pgnb does when it is missing ("error" when it has no fallback: ``require`` says so in one line).
    """

    package: Package
    name: str
    feature: str
    where: str
    without: str
    in_source: bool = False

    @property
    def attribute(self) -> str:
        """The last part of the name, as pgnb's code spells it (``_mux_stream``)."""
        return os.path.basename(self.name) if self.name.startswith("file:") else re.split(r"[:.]", self.name)[-1]


ERROR = "error"

NAMES: tuple[PrivateName, ...] = (
    # ---- torch: the rendezvous every tutorial's init_process_group() goes through
    PrivateName("torch", "torch.distributed.rendezvous:_create_c10d_store", "rendezvous", "rank/rendezvous.py",
                "a cell's own env:// or tcp:// init binds torch's own store (every interface) instead of "
                "meeting on the world's loopback store"),
    PrivateName("torch", "torch.distributed.distributed_c10d:_world.group_count", "rendezvous",
                "rank/rendezvous.py", "a rank whose init failed keeps torch's group counter: its next init "
                "waits for keys the other ranks never write, until pgnb's deadline"),
    PrivateName("torch", "torch.distributed.distributed_c10d:_world.pg_map", "testing", "rank/testing.py",
                "the plugin cannot list the groups a test left behind (no leak report for them)"),
    PrivateName("torch", "torch.distributed.distributed_c10d:_get_default_store", "testing", "rank/testing.py",
                "a failing rank cannot tell its peers early: they stop at the test's timeout instead"),
    PrivateName("torch", "torch.distributed.device_mesh:_mesh_resources", "testing", "rank/testing.py",
                "a DeviceMesh a test made stays in torch's registry after its group is destroyed"),
    # ---- torch: %%pg --trace (the dispatcher-level recorder) and %pg_show of a DTensor
    PrivateName("torch", "torch.utils._python_dispatch:TorchDispatchMode", "trace", "rank/trace.py", ERROR),
    PrivateName("torch", "torch.utils._python_dispatch:TorchDispatchMode._should_skip_dynamo", "trace",
                "rank/trace.py", "the first traced op imports torch._dynamo (~7 s of CPU on 2 cores)"),
    PrivateName("torch", "torch:_C._len_torch_dispatch_stack", "trace", "rank/trace.py", ERROR),
    PrivateName("torch", "torch:_C._get_dispatch_stack_at", "trace", "rank/trace.py", ERROR),
    PrivateName("torch", "torch:_C._pop_torch_dispatch_stack", "trace", "rank/trace.py", ERROR),
    PrivateName("torch", "torch:_C._push_on_torch_dispatch_stack", "trace", "rank/trace.py", ERROR),
    PrivateName("torch", "torch:ops.c10d.allreduce_.default._schema", "trace", "rank/trace.py", ERROR),
    PrivateName("torch", "torch.distributed.distributed_c10d:_resolve_process_group", "trace", "rank/trace.py",
                ERROR),
    PrivateName("torch", "torch:ops._c10d_functional.wait_tensor", "trace", "rank/trace.py",
                "functional collectives (DTensor, tensor parallelism) are recorded without their waits"),
    # (an op torch.distributed._functional_collectives registers when it is imported)
    PrivateName("torch", "torch.distributed._functional_collectives:_wrap_tensor_autograd", "trace",
                "rank/trace.py", "a functional collective under autograd is recorded twice"),
    PrivateName("torch", "torch:ops._c10d_functional_autograd", "trace", "rank/trace.py",
                "functional collectives under autograd are not recorded"),
    PrivateName("torch", "torch:ops.c10d._allgather_base_", "trace", "rank/trace.py",
                "all_gather_into_tensor is not recorded"),
    PrivateName("torch", "torch:ops.c10d._reduce_scatter_base_", "trace", "rank/trace.py",
                "reduce_scatter_tensor is not recorded"),
    PrivateName("torch", "torch.distributed._functional_collectives:AsyncCollectiveTensor", "trace",
                "rank/trace.py", "an async functional collective's result is not seen through"),
    PrivateName("torch", "file:distributed/fsdp/_fully_shard/_fsdp_param_group.py", "trace", "rank/trace.py",
                "FSDP2's calls are described by torch's function names, not 'fully_shard ... of <module>'"),
    PrivateName("torch", "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup._module_fqn",
                "trace", "rank/trace.py", "FSDP2's calls are described without the module's name", in_source=True),
    PrivateName("torch", "file:distributed/tensor/_redistribute.py", "trace", "rank/trace.py",
                "a redistribute is described by torch's function name, not its placements"),
    PrivateName("torch", "file:distributed/tensor/_dispatch.py", "trace", "rank/trace.py",
                "a DTensor op's collectives are described without the op"),
    PrivateName("torch", "file:distributed/tensor/_api.py", "trace", "rank/trace.py",
                "DTensor's entry points are described by torch's inner names"),
    PrivateName("torch", "torch.distributed.pipelining.schedules:_batch_p2p", "trace", "rank/trace.py",
                "a pipeline's sends are described without torch's description of them"),
    PrivateName("torch", "torch.distributed.tensor._utils:compute_local_shape_and_global_offset", "show",
                "rank/values.py", "%pg_show of a DTensor shows its shards without their offsets"),
    PrivateName("torch", "torch.distributed.tensor._api:DTensor._local_tensor", "show", "rank/values.py",
                "a DTensor's shard is read with to_local()", in_source=True),
    # ---- torch: pytest --pgnb-torch (torch's own MultiProcessTestCase on warm ranks)
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcessTestCase._run", "torch_suites",
                "rank/torch_suites.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcessTestCase._start_processes",
                "torch_suites", "testing/torch_suites.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcessTestCase._join_processes",
                "torch_suites", "testing/torch_suites.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcessTestCase._check_return_codes",
                "torch_suites", "testing/torch_suites.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcessTestCase._current_test_name",
                "torch_suites", "testing/torch_suites.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcessTestCase.TEST_ERROR_EXIT_CODE",
                "torch_suites", "testing/torch_suites.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:TEST_SKIPS", "torch_suites",
                "testing/torch_suites.py", ERROR),
    # ---- torch: pytest --pgnb-torch on MultiProcContinuousTest classes (a world per class)
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcContinuousTest._spawn_processes",
                "torch_suites", "testing/torch_continuous.py", ERROR),
    PrivateName("torch",
                "torch.testing._internal.common_distributed:MultiProcContinuousTest._ensure_processes_spawned",
                "torch_suites", "testing/torch_continuous.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcContinuousTest._processes_spawned",
                "torch_suites", "testing/torch_continuous.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcContinuousTest._get_world_size",
                "torch_suites", "testing/torch_continuous.py",
                "the class's world size is read when its first test runs, not before"),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcContinuousTest._init_pg",
                "torch_suites", "rank/torch_continuous.py", ERROR),
    PrivateName("torch", "torch.testing._internal.common_distributed:MultiProcContinuousTest._run_test_given_id",
                "torch_suites", "rank/torch_continuous.py", ERROR),
    # ---- ipyparallel: a cell's one send to many engines, the launchers' hooks
    PrivateName("ipyparallel", "ipyparallel.client.client:Client._mux_stream", "cells", "core/sending.py",
                "cells are sent through client[e].apply_async (slower per rank)", in_source=True),
    PrivateName("ipyparallel", "ipyparallel.client.client:Client._build_targets", "cells", "core/sending.py",
                "cells are sent through client[e].apply_async (slower per rank)"),
    PrivateName("ipyparallel", "ipyparallel.client.asyncresult:AsyncResult._metadata", "cells", "core/sending.py",
                "what a rank sent is read through ipyparallel's own properties (slower)", in_source=True),
    PrivateName("ipyparallel", "ipyparallel.client.client:Client._config", "cells", "core/cluster.py",
                "the controller's address is not known to pgnb (no multi-host check)", in_source=True),
    PrivateName("ipyparallel", "ipyparallel._async:AsyncFirst._thread_loop", "processes", "core/cluster.py",
                "every %pg_init --force leaves ipyparallel's sync thread (and 3 fds) in the kernel",
                in_source=True),
    PrivateName("ipyparallel", "ipyparallel._async:AsyncFirst._async_thread", "processes", "core/cluster.py",
                "every %pg_init --force leaves ipyparallel's sync thread (and 3 fds) in the kernel"),
    PrivateName("ipyparallel", "ipyparallel.cluster.launcher:LocalProcessLauncher._wait", "processes",
                "core/cluster.py", "a lost rank's cause (\"killed by SIGSEGV\") is not reported"),
    PrivateName("ipyparallel", "ipyparallel.cluster.launcher:LocalProcessLauncher._start_waiting", "processes",
                "core/cluster.py", "pytest --pgnb-torch starts the world's controller after collection, not during it"),
    PrivateName("ipyparallel", "ipyparallel.cluster.shellcmd:ShellCommandSend._check_output", "processes",
                "procs/sshlauncher.py", "a dead SSH engine's stop writes the remote traceback to stderr"),
    PrivateName("ipyparallel", "ipyparallel.cluster.launcher:SSHLauncher._ssh_sender", "processes",
                "procs/sshlauncher.py", "a dead SSH engine's stop writes the remote traceback to stderr",
                in_source=True),
    PrivateName("ipyparallel", "ipyparallel.engine.app:IPEngine._signal_stop", "processes", "procs/zygote.py",
                "an engine stopped by SIGTERM exits 1 instead of 0 (reported as a crash)"),
    # ---- IPython, ipykernel, ipywidgets: a cell's traceback and input on the ranks, the status view
    PrivateName("IPython", "IPython.core.interactiveshell:InteractiveShell._showtraceback", "cells",
                "rank/cell.py", ERROR),
    PrivateName("IPython", "IPython.core.compilerop:CachingCompiler._filename_map", "cells", "rank/cell.py",
                "a rank's traceback names the cell's temporary file instead of the cell", in_source=True),
    PrivateName("ipykernel", "ipykernel.kernelbase:Kernel._allow_stdin", "debug", "notebook/magics.py",
                "pdb on a rank is refused as if the frontend could not answer input()"),
    PrivateName("ipykernel", "ipykernel.kernelbase:Kernel._publish_debug_event", "debugger", "debugger/bridge.py",
                ERROR),
    PrivateName("ipywidgets", "ipywidgets.widgets.domwidget:DOMWidget._dom_classes", "view", "notebook/view.py",
                ERROR),
    # ---- pytest: @pytest.mark.world tests on the ranks
    PrivateName("pytest", "_pytest.assertion.rewrite:rewrite_asserts", "testing", "rank/testing.py",
                "a failing assert on a rank says only AssertionError, without the values"),
    PrivateName("pytest", "_pytest.outcomes:Skipped", "testing", "rank/testing.py",
                "pytest.skip() on a rank is reported as a failure"),
    PrivateName("pytest", "_pytest.skipping:evaluate_skip_marks", "testing", "testing/plugin.py", ERROR),
    PrivateName("pytest", "_pytest.python:Function._fixtureinfo", "testing", "testing/plugin.py", ERROR,
                in_source=True),
    PrivateName("pytest-cov", "pytest_cov.plugin:CovPlugin._disabled", "testing", "testing/coverage.py",
                "the ranks' lines are counted even where pytest-cov was switched off mid-run", in_source=True),
    # ---- HF Accelerate (a user's library, touched only once a cell imported it): a world's end
    PrivateName("accelerate", "accelerate.state:AcceleratorState._reset_state", "your stack",
                "rank/library_state.py", "an Accelerator made after a re-init at another world size keeps the "
                "old size (its gather fails)"),
)


def installed_version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"


def _module_file(module: str) -> str:
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise ImportError(f"No module named {module!r}")
    return found.origin


def problem(entry: PrivateName) -> str | None:
    """Why ``entry`` is not what pgnb expects in the installed package, or None when it is."""
    try:
        if entry.name.startswith("file:"):
            root = os.path.dirname(_module_file(entry.package))
            path = os.path.join(root, entry.name[len("file:"):])
            return None if os.path.isfile(path) else "no such file"
        module_name, _, attrs = entry.name.partition(":")
        obj: object = importlib.import_module(module_name)
        parts = attrs.split(".")
        for i, part in enumerate(parts):
            if entry.in_source and i == len(parts) - 1:
                # set on instances: the module that defines the class must still use it
                source = inspect.getsource(importlib.import_module(module_name))
                return None if f".{part}" in source else f"{module_name} no longer uses .{part}"
            obj = getattr(obj, part)
    except Exception as e:  # ImportError, AttributeError, OSError (no source), torch's RuntimeError
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def message(entry: PrivateName, why: str) -> str:
    """The one line for a private name that moved: the name, the installed version, where to look."""
    return (f"pgnb's {entry.feature} relies on {entry.package}'s private {entry.name.replace(':', '.')}, "
            f"which {entry.package} {installed_version(entry.package)} changed ({why}); "
            f"pgnb is tested with the versions in {SUPPORTED}")


class PrivateNameMoved(RuntimeError):
    """A private name that pgnb cannot do without is missing from the installed package."""


@cache
def require(feature: str) -> None:
    """Raise PrivateNameMoved, one line, when a name that ``feature`` cannot do without is missing
    (checked once per process; the names with a fallback are not looked at here)."""
    for entry in NAMES:
        if entry.feature == feature and entry.without == ERROR and not entry.in_source:
            why = problem(entry)
            if why is not None:
                raise PrivateNameMoved(message(entry, why))
