"""A pool's engines as a batch system's job (pgnb.slurm): what the job is doing, said in Slurm's own words.

While engines are awaited, a job waiting in the queue is said with its id,
state and reason; one that ended, or can never start (a request its partition
cannot hold), stops the wait. When engines are lost, how their job ended is the
cause. Engine sets that are no batch job (no ``job_state``) say nothing here.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..errors import EngineStartError
from ..procs.slurmlauncher import ENDED_STATES, ENDED_WORDS, HOPELESS_REASONS
from .waiting import poll_until


def _why(reason: str) -> str:
    return f" ({reason})" if reason and reason != "None" else ""


def jobs(cluster: Any) -> list[tuple[str, tuple[str, str]]]:
    """``(job id, (state, reason))`` of each engine set of ``cluster`` that is a batch job."""
    out = []
    with contextlib.suppress(Exception):  # the engine sets may change under us
        for engine_set in list(cluster.engines.values()):
            job_state = getattr(engine_set, "job_state", None)
            state = job_state() if callable(job_state) else None
            if state is not None:
                out.append((str(engine_set.job_id), state))
    return out


def check_queue(cluster: Any) -> str:
    """What the start waits for in the queue ("Slurm job 12: PENDING (Resources)", or ""); raises
    ``EngineStartError`` for a job that ended, or that waits for what its partition has not got."""
    waiting = ""
    for job, (state, reason) in jobs(cluster):
        if state in ENDED_STATES:
            raise EngineStartError(f"Slurm job {job} ended before its engines registered: {state}{_why(reason)}; "
                                   "see the job's output in the IPython profile's log folder")
        if state == "PENDING" and reason in HOPELESS_REASONS:
            raise EngineStartError(f"Slurm job {job} cannot start: PENDING{_why(reason)}, it asks for more than the "
                                   "partition has (fewer ranks, or another partition); pgnb cancelled it")
        if state == "PENDING":
            waiting = f"Slurm job {job}: PENDING{_why(reason)}"
    return waiting


def ended_job(cluster: Any) -> str | None:
    """How the batch job of ``cluster``'s engines ended, if it has ("Slurm job 12 was cancelled"); any thread.

    A job whose processes Slurm is killing says COMPLETING for a moment (~0.7 s here) before how it ended."""
    found: list[tuple[str, tuple[str, str]]] = []

    def settled() -> bool:
        nonlocal found
        found = jobs(cluster)
        return not any(state == "COMPLETING" for _, (state, _) in found)

    poll_until(settled, 2.0, step=0.1)
    for job, (state, reason) in found:
        if state in ENDED_STATES or state == "COMPLETING":
            return f"Slurm job {job} {ENDED_WORDS.get(state, state)}{_why(reason)}"
    return None
