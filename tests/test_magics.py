"""Each behaviour through both faces: the Python API and the magic (InteractiveShell, no kernel)."""

from __future__ import annotations

import time

import pytest
from conftest import wait_gone
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import pgnb
from pgnb.notebook.current import set_current


def nccl_refusal() -> str:
    """What ``--backend nccl`` is refused with on a machine with no GPU: a CUDA build of torch has nccl."""
    import torch.distributed as dist

    if dist.is_nccl_available():
        return "needs a GPU per rank and none is visible"
    return "not available in this torch build"


BAD = [
    ({"world": 0}, "--world 0", "--world must be at least 1"),
    ({"backend": "bogus"}, "--backend bogus", "unknown backend 'bogus'"),
    ({"backend": "nccl"}, "--backend nccl", nccl_refusal),
    ({"init_method": "udp://h:1"}, "--init-method udp://h:1", "no rendezvous handler"),
    ({"init_method": "file:///missing/dir/x"}, "--init-method file:///missing/dir/x", "does not exist"),
    ({"timeout": -1}, "--timeout -1", "positive number"),
    ({"world": 10**6}, "--world 1000000", "more than this machine can hold"),
]


@pytest.fixture(params=["func", "magic"])
def start(request, shell):
    """Start a world through the API or through %pg_init; returns the Sandbox."""

    def via_func(**kwargs):
        spec = pgnb.WorldSpec.validate(**kwargs)
        sb = pgnb.current()
        if sb is None:
            sb = pgnb.Sandbox(spec=spec)
            set_current(sb)
        return sb.init(spec)

    def via_magic(**kwargs):
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in kwargs.items())
        try:
            with capture_output():
                shell.run_line_magic("pg_init", flags)
        except UsageError as e:
            raise pgnb.PgnbError(str(e)) from None
        return pgnb.current()

    return via_func if request.param == "func" else via_magic


@pytest.mark.parametrize("kwargs, line, words", BAD, ids=[b[1] for b in BAD])
def test_bad_input_fails_fast_with_one_line(start, kwargs, line, words):
    words = words() if callable(words) else words
    t0 = time.monotonic()
    with pytest.raises(pgnb.PgnbError, match=words) as info:
        start(**kwargs)
    assert time.monotonic() - t0 < 5
    assert "\n" not in str(info.value)
    assert pgnb.current() is None  # nothing was started


@pytest.mark.integration
def test_init_destroy_reinit_shutdown(start, shell):
    sb = start(world=2)
    assert [r.state for r in sb.status()] == ["initialized"] * 2
    first_pids = [r.pid for r in sb.status()]
    with capture_output():
        shell.run_line_magic("pg_destroy", "")
    assert [r.state for r in sb.snapshot().ranks] == ["destroyed"] * 2
    sb2 = start(world=2, init_method="tcp")
    assert sb2 is sb and [r.pid for r in sb.status()] == first_pids  # engines reused
    pids = sb.pids
    with capture_output() as cap:
        shell.run_line_magic("pg_shutdown", "")
    assert "destroyed" in cap.outputs[0].data["text/plain"]
    assert pgnb.current() is None
    assert wait_gone(pids) == []


def test_magic_help_comes_from_the_arguments(shell):
    doc = shell.find_line_magic("pg_init").__doc__
    for flag in ("--backend", "--world", "--init-method", "--timeout", "--group-name", "--launcher",
                 "--profile", "--cluster-id", "--threads", "--debug", "--force"):
        assert flag in doc


def test_pg_before_init_is_a_usage_error(shell):
    result = shell.run_cell("%%pg\nprint(1)\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "run %pg_init first" in str(result.error_in_exec)


def test_shutdown_without_a_world_is_fine(shell):
    with capture_output() as cap:
        shell.run_line_magic("pg_shutdown", "")
    assert cap.outputs == [] and cap.stdout == "" and cap.stderr == ""
