"""What the user asked for, validated before anything starts.

``WorldSpec.validate(...)`` turns raw options (from the magic or the API)
into a normalised, immutable spec, or raises a one-line ``SpecError``.
Checks that need torch import it lazily, and only when the answer is not
already known (a plain ``gloo`` world never imports torch in the kernel).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from urllib.parse import urlparse

from .errors import BackendUnavailable, SpecError

BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
INIT_SCHEMES = ("env", "tcp", "file")
DEBUG_LEVELS = {"off": "OFF", "info": "INFO", "detail": "DETAIL"}
LAUNCHER_ALIASES = {"fork": "pgnb.fork"}

# A local rank costs an engine (~200 MB once torch is imported) and a nanny.
_BYTES_PER_LOCAL_RANK = 256 * 2**20
_BACKEND_PART = re.compile(r"^(?:(?P<device>[a-z][a-z0-9_]*):)?(?P<name>[a-z][a-z0-9_]*)$")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_world_limit() -> int:
    """The largest local world this machine can hold (override: PGNB_MAX_LOCAL_WORLD)."""
    override = os.environ.get("PGNB_MAX_LOCAL_WORLD")
    if override:
        return int(override)
    try:
        # total, not available, memory: the limit must not change with the machine's load
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 64
    return max(1, total // _BYTES_PER_LOCAL_RANK)


@dataclass(frozen=True)
class WorldSpec:
    """One torch.distributed world: every ``init_process_group`` argument and how to host it."""

    backend: str = "gloo"
    world: int = 2
    init_method: str = "env"  # "env", "tcp", "file", or a full URL
    timeout: float = 60.0
    group_name: str = ""
    launcher: str = "pgnb.fork"
    profile: str | None = None
    cluster_id: str | None = None
    threads: int | None = None
    debug: str = "off"
    #: rank -> seconds that rank sleeps before joining the rendezvous (for lessons and tests)
    delay_ranks: tuple[tuple[int, float], ...] = field(default=())

    # ---- derived facts -------------------------------------------------
    @property
    def scheme(self) -> str:
        return self.init_method.split("://", 1)[0]

    @property
    def init_url(self) -> str | None:
        """The user's own URL, or None when pgnb picks address/path at init time."""
        return self.init_method if "://" in self.init_method else None

    @property
    def attached(self) -> bool:
        """Engines come from a cluster someone else started (ipcluster)."""
        return self.profile is not None or self.cluster_id is not None

    @property
    def backend_names(self) -> list[str]:
        return [_BACKEND_PART.match(p).group("name") for p in self.backend.split(",")]  # type: ignore[union-attr]

    @property
    def uses_cuda(self) -> bool:
        return any(n in ("nccl", "xccl") for n in self.backend_names)

    @property
    def threads_per_rank(self) -> int:
        return self.threads if self.threads else max(1, cpu_count() // self.world)

    def describe(self) -> str:
        """A deterministic one-line summary (no ports, paths or timings)."""
        shown_init = self.init_method if "://" in self.init_method else f"{self.init_method}://"
        parts = [f"backend {self.backend}", f"world {self.world}", f"init {shown_init}"]
        if self.group_name:
            parts.append(f"group {self.group_name!r}")
        return ", ".join(parts)

    def with_(self, **changes: object) -> WorldSpec:
        return replace(self, **changes)  # type: ignore[arg-type]

    # ---- validation ----------------------------------------------------
    @classmethod
    def validate(
        cls,
        backend: str = "gloo",
        world: object = 2,
        init_method: str = "env",
        timeout: object = 60.0,
        group_name: str = "",
        launcher: str = "fork",
        profile: str | None = None,
        cluster_id: str | None = None,
        threads: object = None,
        debug: str = "off",
        delay_ranks: object = (),
        gpu_count: int | None = None,
    ) -> WorldSpec:
        """Check everything that can be checked without starting anything."""
        world_n = _positive_int("--world", world)
        attached = profile is not None or cluster_id is not None
        if not attached and launcher in ("local", "pgnb.fork", "fork") and world_n > local_world_limit():
            raise SpecError(
                f"--world {world_n} is more than this machine can hold locally "
                f"({local_world_limit()} ranks at ~256 MB each); use a smaller world, "
                "another --launcher, or set PGNB_MAX_LOCAL_WORLD to override"
            )
        timeout_s = _positive_float("--timeout", timeout)
        threads_n = None if threads in (None, "", 0) else _positive_int("--threads", threads)
        debug_l = str(debug).lower()
        if debug_l not in DEBUG_LEVELS:
            raise SpecError(f"unknown --debug {debug!r}; use one of: {', '.join(DEBUG_LEVELS)}")
        backend_n = _normalise_backend(backend)
        init_n = _normalise_init_method(init_method)
        delays = _parse_delays(delay_ranks, world_n)
        launcher_n = LAUNCHER_ALIASES.get(str(launcher), str(launcher))
        if not launcher_n or any(c.isspace() for c in launcher_n):
            raise SpecError(f"bad --launcher {launcher!r}; use local, fork, mpi, slurm, ssh, ...")
        spec = cls(
            backend=backend_n,
            world=world_n,
            init_method=init_n,
            timeout=timeout_s,
            group_name=str(group_name),
            launcher=launcher_n,
            profile=profile or None,
            cluster_id=cluster_id or None,
            threads=threads_n,
            debug=debug_l,
            delay_ranks=delays,
        )
        _check_backend_available(spec, gpu_count)
        return spec


def _positive_int(option: str, value: object) -> int:
    try:
        if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
            raise ValueError
        text = str(value).strip()
        if not isinstance(value, (int, float)) and not _plain_number(text):
            raise ValueError  # int() would read "١٢" or "1_000"; a typo should not start 12 ranks
        n = int(text) if not isinstance(value, (int, float)) else int(value)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(f"{option} must be a whole number, not {value!r}") from None
    if n < 1:
        raise SpecError(f"{option} must be at least 1, not {n}")
    return n


def _plain_number(text: str) -> bool:
    """ASCII digits, sign, point, exponent (or inf/nan, refused later): what a user types as a number."""
    return text.isascii() and "_" not in text and text != ""


def _positive_float(option: str, value: object) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, str) and not _plain_number(value.strip()):
            raise ValueError
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise SpecError(f"{option} must be a number of seconds, not {value!r}") from None
    if not (x > 0) or x == float("inf"):
        raise SpecError(f"{option} must be a positive number of seconds, not {value!r}")
    return x


def _normalise_backend(backend: object) -> str:
    text = str(backend).strip().lower().replace(" ", "")
    if not text:
        raise SpecError("--backend is empty; use gloo, nccl, mpi, ucc or e.g. cpu:gloo,cuda:nccl")
    parts = text.split(",")
    matches = [_BACKEND_PART.match(p) for p in parts]
    if not all(matches) or (len(parts) > 1 and not all(m.group("device") for m in matches if m)):
        raise SpecError(
            f"cannot read --backend {backend!r}; use a name like gloo or a device map like cpu:gloo,cuda:nccl"
        )
    return text


def _check_backend_available(spec: WorldSpec, gpu_count: int | None) -> None:
    names = spec.backend_names
    if all(n == "gloo" for n in names):
        return  # gloo ships with every torch build pgnb supports; no torch import needed
    import torch.distributed as dist  # lazy: costs ~1.4 s the first time

    known = set(dist.Backend.backend_list) | set(BUILTIN_BACKENDS)
    for name in names:
        if name not in known or name in ("undefined", "fake"):
            raise SpecError(
                f"unknown backend {name!r}; torch knows: "
                + ", ".join(b for b in dist.Backend.backend_list if b not in ("undefined", "fake"))
            )
        if not spec.attached and not dist.is_backend_available(name):
            hint = "use --backend gloo"
            if name == "nccl":
                hint = "NCCL needs a CUDA build of torch and a GPU; use --backend gloo on CPU"
            raise BackendUnavailable(f"backend {name!r} is not available in this torch build; {hint}")
    if spec.uses_cuda and not spec.attached:
        if gpu_count is None:
            import torch

            gpu_count = torch.cuda.device_count()
        check_gpu_count(spec, gpu_count)


def check_gpu_count(spec: WorldSpec, gpu_count: int) -> None:
    """NCCL cannot put two ranks on one GPU: a local world needs a GPU per rank."""
    if spec.uses_cuda and gpu_count < spec.world:
        raise BackendUnavailable(
            f"backend {spec.backend!r} needs one GPU per rank: --world {spec.world} but "
            f"{gpu_count} GPU(s) visible; use --world {gpu_count} or --backend gloo"
            if gpu_count
            else f"backend {spec.backend!r} needs a GPU per rank and none is visible; use --backend gloo"
        )


def _normalise_init_method(init_method: object) -> str:
    text = str(init_method).strip()
    if text.lower() in INIT_SCHEMES:
        return text.lower()
    if text.lower().rstrip("/:") in INIT_SCHEMES:  # "env:" or "env://"
        return text.lower().rstrip("/:")
    if "://" not in text:
        raise SpecError(f"unknown --init-method {text!r}; use env, tcp, file, or a URL like tcp://host:port")
    try:
        parsed = urlparse(text)
    except ValueError as e:  # e.g. "Invalid IPv6 URL" for tcp://[::1
        raise SpecError(f"cannot read --init-method {text!r}: {e}") from None
    scheme = parsed.scheme.lower()
    if scheme not in INIT_SCHEMES:
        raise SpecError(
            f"torch has no rendezvous handler for {scheme + '://'!r}; use env://, tcp://host:port or file:///path"
        )
    if scheme == "env":
        return "env"
    if scheme == "tcp":
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None:
            raise SpecError(f"--init-method {text!r} needs a host and a port, like tcp://127.0.0.1:23456")
        return f"tcp://{parsed.hostname}:{port}"
    # file://
    path = parsed.path
    if not path or not path.startswith("/"):
        raise SpecError(f"--init-method {text!r} needs an absolute path, like file:///tmp/pgnb-store")
    directory = os.path.dirname(path) or "/"
    if not os.path.isdir(directory):
        # torch would wait forever on a store file it can never create
        raise SpecError(f"directory {directory!r} of --init-method {text!r} does not exist; create it first")
    return f"file://{path}"


def _parse_delays(delays: object, world: int) -> tuple[tuple[int, float], ...]:
    """Accept ``"2:5,3:1"`` or ``{2: 5}`` or pairs; ranks must exist."""
    if not delays:
        return ()
    items: list[tuple[object, object]]
    if isinstance(delays, str):
        items = []
        for chunk in delays.split(","):
            rank, sep, secs = chunk.partition(":")
            if not sep:
                raise SpecError(f"cannot read --delay-rank {delays!r}; use RANK:SECONDS, e.g. 2:5")
            items.append((rank, secs))
    elif isinstance(delays, dict):
        items = list(delays.items())
    else:
        items = list(delays)  # type: ignore[call-overload]
    out = []
    for rank, secs in items:
        try:
            r = int(str(rank).strip())
        except ValueError:
            raise SpecError(f"cannot read --delay-rank rank {rank!r}; use RANK:SECONDS") from None
        if not 0 <= r < world:
            raise SpecError(f"--delay-rank names rank {r}, but the world has ranks 0-{world - 1}")
        out.append((r, _positive_float("--delay-rank seconds", secs)))
    return tuple(sorted(out))
