"""What the user asked for, validated before anything starts.

``WorldSpec.validate(...)`` turns raw options (from the magic or the API)
into a normalised, immutable spec, or raises a one-line ``SpecError``.
Checks that need torch import it lazily, and only when the answer is not
already known (a plain ``gloo`` world never imports torch in the kernel).
"""

from __future__ import annotations

import inspect
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlparse

from .errors import BackendUnavailable, SpecError

BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
INIT_SCHEMES = ("env", "tcp", "file")
DEBUG_LEVELS = {"off": "OFF", "info": "INFO", "detail": "DETAIL"}
LAUNCHER_ALIASES = {"fork": "pgnb.fork", "slurm": "pgnb.slurm"}
#: Launchers whose engines run on this machine (the kernel's): pgnb's zygote and ipyparallel's own.
LOCAL_LAUNCHERS = ("local", "pgnb.fork")

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


def _option(default: Any, *flags: str, help: str, given: Any = None, metavar: str | None = None,
            shown: Callable[[Any], str] = str, always: bool = False) -> Any:
    """A ``WorldSpec`` field that is also a ``%pg_init`` option and a ``Sandbox`` keyword.

    ``given``: the default as a user writes it (``fork``), where the field holds the normal
    form (``pgnb.fork``); ``shown``: the value as written in a ``%pg_init`` line; ``always``:
    the ``%pg_init ... --force`` line names it even at its default.
    """
    meta = {"flags": flags, "help": help, "given": default if given is None else given, "metavar": metavar,
            "shown": shown, "always": always}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class WorldSpec:
    """One torch.distributed world: every ``init_process_group`` argument and how to host it.

    Its fields are THE table of ``%pg_init`` options: the magic's arguments, the
    ``Sandbox`` keywords and the ``%pg_init ... --force`` line are all made from them.
    """

    backend: str = _option("gloo", "--backend", "-b", always=True,
                           help="torch backend: gloo, nccl, mpi, ucc, or a device map like cpu:gloo,cuda:nccl")
    world: int = _option(2, "--world", "-n", always=True, help="world size = number of ranks (default 2)")
    init_method: str = _option("env", "--init-method",
                               help="env, tcp, file, or a URL: env://, tcp://host:port, file:///path (default env)")
    timeout: float = _option(60.0, "--timeout", shown=lambda v: f"{v:g}",
                             help="seconds; passed to torch and enforced by pgnb itself (default 60)")
    group_name: str = _option("", "--group-name", help="passed to init_process_group (shown in the view)")
    launcher: str = _option("pgnb.fork", "--launcher", given="fork",
                            shown=lambda v: {full: short for short, full in LAUNCHER_ALIASES.items()}.get(v, v),
                            help="ipyparallel engine launcher: fork (pgnb's: engines forked from one process that "
                                 "imported torch once), local, mpi, slurm (pgnb's: a zygote per node), ssh, ... "
                                 "(default fork)")
    profile: str | None = _option(None, "--profile", help="attach to the ipyparallel cluster of this IPython profile")
    cluster_id: str | None = _option(None, "--cluster-id", help="attach to the ipyparallel cluster with this id")
    threads: int | None = _option(None, "--threads", help="torch intra-op threads per rank (default cores // world)")
    debug: str = _option("off", "--debug", help="TORCH_DISTRIBUTED_DEBUG on the ranks: off, info, detail")
    #: rank -> seconds that rank sleeps before joining the rendezvous (for lessons and tests)
    delay_ranks: tuple[tuple[int, float], ...] = _option(
        (), "--delay-rank", given="", metavar="RANK:SECONDS", shown=lambda v: ",".join(f"{r}:{s:g}" for r, s in v),
        help="make a rank join the rendezvous late, e.g. 2:5 (for lessons)")

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
    def local(self) -> bool:
        """Every rank runs on this machine, started by pgnb (not attached, a local launcher)."""
        return not self.attached and self.launcher in LOCAL_LAUNCHERS

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
    def validate(cls, gpu_count: int | None = None, **options: Any) -> WorldSpec:
        """Check everything that can be checked without starting anything.

        ``options`` are the fields by name, as a user writes them (``world="4"``,
        ``launcher="fork"``, ``delay_ranks="2:5"``); missing ones take their defaults.
        """
        unknown = sorted(set(options) - {f.name for f in option_fields()})
        if unknown:
            raise SpecError(f"unknown option {unknown[0]!r}; the options are: "
                            + ", ".join(f.name for f in option_fields()))
        given = {f.name: options.get(f.name, f.metadata["given"]) for f in option_fields()}
        backend, world, init_method, timeout = (given["backend"], given["world"], given["init_method"],
                                                given["timeout"])
        group_name, launcher, profile, cluster_id = (given["group_name"], given["launcher"], given["profile"],
                                                     given["cluster_id"])
        threads, debug, delay_ranks = given["threads"], given["debug"], given["delay_ranks"]
        world_n = _positive_int("--world", world)
        attached = profile is not None or cluster_id is not None
        if not attached and LAUNCHER_ALIASES.get(str(launcher), str(launcher)) in LOCAL_LAUNCHERS \
                and world_n > local_world_limit():
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
            rank_text, sep, secs_text = chunk.partition(":")
            if not sep:
                raise SpecError(f"cannot read --delay-rank {delays!r}; use RANK:SECONDS, e.g. 2:5")
            items.append((rank_text, secs_text))
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


def option_fields() -> tuple[Field[Any], ...]:
    """The ``%pg_init`` options, in the order the magic lists them."""
    return fields(WorldSpec)


def keywords_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature with its ``**options`` spelled out as the option keywords (for help() and editors)."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata["given"])
               for f in option_fields()]
    return sig.replace(parameters=params)


def init_command(spec: WorldSpec, force: bool = True) -> str:
    """The ``%pg_init`` line that asks for ``spec`` again (options at their default are left out)."""
    words = ["%pg_init"]
    for f in option_fields():
        value = getattr(spec, f.name)
        if f.metadata["always"] or value != f.default:
            words += [f.metadata["flags"][0], f.metadata["shown"](value)]
    if force:
        words.append("--force")
    return " ".join(shlex.quote(w) for w in words)


def parse_ranks(text: str | None, world: int) -> list[int] | None:
    """``"0,2-3"`` -> ``[0, 2, 3]``; None or ``"all"`` -> None (every rank).

    Raises ``ValueError`` with a one-line reason for anything else.
    """
    if text is None or text.strip().lower() == "all":
        return None
    stripped = text.strip()
    if not stripped:
        raise ValueError("--ranks is empty; use e.g. 0 or 0,2 or 1-3")
    chosen: list[int] = []
    for part in stripped.split(","):
        part = part.strip()
        lo_s, dash, hi_s = part.partition("-")
        if not _is_digits(lo_s) or (dash and not _is_digits(hi_s)):
            raise ValueError(f"cannot read --ranks {text!r}: {part!r} is not a rank or a range like 1-3")
        lo, hi = int(lo_s), int(hi_s) if dash else int(lo_s)
        if lo > hi:
            raise ValueError(f"--ranks range {part!r} goes backwards; write {hi}-{lo}")
        if hi >= world:
            raise ValueError(f"--ranks {text!r} names rank {hi}, but the world has ranks 0-{world - 1}")
        chosen.extend(r for r in range(lo, hi + 1) if r not in chosen)
    return sorted(chosen)


def _is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()
