"""What the user asks for is checked before anything starts (no engines here)."""

import time

import pytest

from pgnb import SpecError, WorldSpec
from pgnb.spec import parse_ranks


def test_defaults():
    spec = WorldSpec.validate()
    assert (spec.backend, spec.world, spec.init_method, spec.timeout) == ("gloo", 2, "env", 60.0)
    assert spec.describe() == "backend gloo, world 2, init env://"


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"world": 0}, "--world must be at least 1"),
        ({"world": -3}, "--world must be at least 1"),
        ({"world": "two"}, "--world must be a whole number"),
        ({"world": 2.5}, "--world must be a whole number"),
        ({"world": 100000}, "more than this machine can hold"),
        ({"timeout": 0}, "--timeout must be a positive number"),
        ({"timeout": "-1"}, "--timeout must be a positive number"),
        ({"timeout": "soon"}, "--timeout must be a number"),
        ({"init_method": "udp://x:1"}, "no rendezvous handler for 'udp://'"),
        ({"init_method": "carrier-pigeon"}, "unknown --init-method"),
        ({"init_method": "tcp://127.0.0.1"}, "needs a host and a port"),
        ({"init_method": "file:///no/such/dir/store"}, "does not exist"),
        ({"init_method": "file://relative"}, "absolute path"),
        ({"debug": "loud"}, "unknown --debug"),
        ({"backend": ""}, "--backend is empty"),
        ({"backend": "gloo nccl!"}, "cannot read --backend"),
        ({"backend": "gloo,nccl"}, "cannot read --backend"),
        ({"backend": "bogus"}, "unknown backend 'bogus'"),
        ({"backend": "nccl"}, "nccl"),
        ({"backend": "cpu:gloo,cuda:nccl"}, "nccl"),
        ({"backend": "mpi"}, "mpi"),
        ({"backend": "ucc"}, "ucc"),
        ({"delay_ranks": "5:1"}, "names rank 5"),
        ({"delay_ranks": "x"}, "cannot read --delay-rank"),
        ({"threads": 0.5}, "--threads must be a whole number"),
    ],
)
def test_bad_input_is_one_clear_line(kwargs, words):
    t0 = time.monotonic()
    with pytest.raises(SpecError) as info:
        WorldSpec.validate(**kwargs)
    msg = str(info.value)
    assert words in msg
    assert "\n" not in msg
    assert time.monotonic() - t0 < 5


def test_nccl_without_enough_gpus_says_how_many():
    with pytest.raises(SpecError, match=r"--world 4 but 1 GPU\(s\) visible"):
        # the GPU count is injected: this CPU machine refuses nccl earlier (test above)
        from pgnb.spec import check_gpu_count

        check_gpu_count(WorldSpec(backend="nccl", world=4), gpu_count=1)


def test_init_method_forms():
    assert WorldSpec.validate(init_method="env://").init_method == "env"
    assert WorldSpec.validate(init_method="TCP").init_method == "tcp"
    assert WorldSpec.validate(init_method="tcp://127.0.0.1:23456").init_url == "tcp://127.0.0.1:23456"
    spec = WorldSpec.validate(init_method="file:///tmp/pgnb-store")
    assert spec.scheme == "file" and spec.init_url == "file:///tmp/pgnb-store"


def test_threads_default_avoids_oversubscription():
    from pgnb.spec import cpu_count

    assert WorldSpec.validate(world=1).threads_per_rank == cpu_count()
    assert WorldSpec.validate(world=64).threads_per_rank == 1
    assert WorldSpec.validate(world=2, threads=3).threads_per_rank == 3


def test_world_limit_override(monkeypatch):
    monkeypatch.setenv("PGNB_MAX_LOCAL_WORLD", "3")
    with pytest.raises(SpecError, match="PGNB_MAX_LOCAL_WORLD"):
        WorldSpec.validate(world=4)
    assert WorldSpec.validate(world=4, profile="elsewhere").world == 4  # attached worlds are not local


@pytest.mark.parametrize(
    "text, world, expected",
    [(None, 4, None), ("all", 4, None), ("0", 4, [0]), ("0,2", 4, [0, 2]), ("1-3", 4, [1, 2, 3]),
     ("0,2-3", 4, [0, 2, 3]), (" 3 , 1 ", 4, [1, 3]), ("1,1-2", 4, [1, 2])],
)
def test_parse_ranks(text, world, expected):
    assert parse_ranks(text, world) == expected


@pytest.mark.parametrize(
    "text, words",
    [("", "empty"), ("4", "names rank 4"), ("0-9", "names rank 9"), ("3-1", "backwards"), ("a", "not a rank"),
     ("-1", "not a rank"), ("1-", "not a rank"), ("0,,1", "not a rank"), ("1.5", "not a rank"),
     ("99999999999999999999999", "names rank"), ("²", "not a rank"), ("0;1", "not a rank")],
)
def test_parse_ranks_refuses(text, words):
    with pytest.raises(ValueError, match=words):
        parse_ranks(text, 4)
