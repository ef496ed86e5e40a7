"""An ipyparallel engine-set launcher for Slurm whose engines are forked, per node, from a zygote.

``ipyparallel.Cluster(engine_launcher_class="pgnb.slurm")`` (entry point; ``%pg_init
--launcher slurm``) submits one sbatch job of ``n`` tasks, as ipyparallel's
``SlurmEngineSetLauncher`` does, with every option of that launcher from the
profile (``c.SlurmEngineSetLauncher.queue``, ``account``, ``timelimit``,
``options``, ``batch_template``...). Its batch script runs one srun task per
node: a zygote (:mod:`pgnb.procs.zygote`, ``--slurm``) that imports torch once
and forks that node's engines, each with the ``SLURM_PROCID``, ``SLURM_LOCALID``
and ``SLURM_NODEID`` it would have had as its own srun task. Slurm still places,
limits, accounts and cancels everything; the engines reach the controller as
ipyparallel's do.

What it adds to ipyparallel's launcher: sbatch's own complaint as the error
(not "returned non-zero exit status 1"), ``job_state()`` for what the job is
doing (pending and why, or how it ended), and a ``stop`` that returns once the
job has left the queue.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from ipyparallel.cluster.launcher import LauncherError, SlurmEngineSetLauncher
from traitlets import Float, Integer, List, Unicode, default

from .forklauncher import zygote_command

#: Job states after which the job runs no more (squeue's long names).
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})
#: How an ended job reads in a lost rank's cause ("Slurm job 12 was cancelled").
ENDED_WORDS = {"CANCELLED": "was cancelled", "TIMEOUT": "reached its time limit", "NODE_FAIL": "lost its node",
               "PREEMPTED": "was preempted", "OUT_OF_MEMORY": "ran out of memory", "COMPLETED": "ended",
               "FAILED": "failed", "DEADLINE": "reached its deadline", "BOOT_FAIL": "failed to boot its node",
               "COMPLETING": "is ending (COMPLETING)"}
#: Pending reasons that the job's own request causes: it will wait forever for what the cluster has not got.
HOPELESS_REASONS = frozenset({"BadConstraints", "InvalidAccount", "InvalidQOS", "PartitionConfig",
                              "PartitionNodeLimit", "PartitionTimeLimit", "QOSMaxCpuPerJobLimit",
                              "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit"})


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # sbatch says "error: <what>" then "error: Batch job submission failed: <why>": the second is the reason
    failed = [ln for ln in lines if "submission failed" in ln]
    return (failed or lines or [""])[0]


class SlurmForkEngineSetLauncher(SlurmEngineSetLauncher):  # type: ignore[misc]  # ipyparallel is untyped
    """Launch one Slurm job whose engines are forked on each node from one zygote that imported torch."""

    preload = List(Unicode(), ["torch", "torch.distributed"], config=True,
                   help="Modules each node's zygote imports before forking its engines.")
    stop_seconds_until_kill = Integer(5, config=True,
                                      help="Seconds between SIGTERM and SIGKILL when a zygote stops its engines.")
    leave_queue_timeout = Float(10, config=True, help="Seconds stop() waits for the job to leave the queue.")
    batch_file_name = Unicode("slurm_engine.sbatch", config=True, help="batch file name for the engine(s) job.")

    def __init__(self, work_dir: str = ".", config: Any = None, **kwargs: Any) -> None:
        super().__init__(work_dir=work_dir, config=config, **kwargs)
        # the batch script beside the engines' logs, not in the notebook's folder
        self.batch_file = os.path.join(self.profile_dir, "log", f"{self.identifier}-{self.batch_file_name}")

    @default("default_template")
    def _default_template(self) -> str:
        # the job's layout, for the zygotes (a step's own SLURM_TASKS_PER_NODE is the step's)
        return """#!/bin/sh
#SBATCH --export=ALL
#SBATCH --job-name=ipengine-{cluster_id}
export PGNB_SLURM_TASKS_PER_NODE="$SLURM_TASKS_PER_NODE"
srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 {program_and_args}
"""

    @default("program")
    def _default_program(self) -> list[str]:
        log_prefix = os.path.join(self.profile_dir, "log", f"ipengine-{self.cluster_id}-{self.engine_set_id}-")
        return [*zygote_command(self.stop_seconds_until_kill, list(self.preload)), "--slurm", log_prefix, "--"]

    @default("program_args")
    def _default_program_args(self) -> list[str]:
        return [*self.cluster_args, *self.engine_args]

    def _run_command(self, command: list[str], **kwargs: Any) -> str:
        """A Slurm command; its failure raised with Slurm's own words."""
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, **kwargs)
        out: str = done.stdout.decode("utf8", "replace")
        if done.returncode != 0:
            why = _first_line(done.stderr.decode("utf8", "replace") or out)
            raise LauncherError(why or f"{command[0]} exited with status {done.returncode}")
        return out

    def job_state(self) -> tuple[str, str] | None:
        """``(state, reason)`` of the job as squeue says (``("PENDING", "Resources")``); None: not known."""
        if not self.job_id:
            return None
        try:
            out = self._run_command(["squeue", "-h", "-j", self.job_id, "--states=all", "-o", "%T|%r"])
        except (LauncherError, OSError):
            return None
        state, _, reason = out.strip().partition("|")
        return (state, reason) if state else None

    def stop(self) -> Any:
        """``scancel`` the job, then wait (``leave_queue_timeout``) until Slurm has let it go."""
        output = super().stop()
        deadline = time.monotonic() + self.leave_queue_timeout
        while time.monotonic() < deadline:
            state = self.job_state()
            if state is None or state[0] in ENDED_STATES:
                break
            time.sleep(0.1)
        return output
