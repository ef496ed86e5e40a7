"""The variables torchrun gives its workers, with the values torchrun would give each rank of a world.

torch's elastic agent (``torch/distributed/elastic/agent/server/local_elastic_agent.py``) sets them
for every worker it starts; training code reads them (``int(os.environ["LOCAL_WORLD_SIZE"])`` for a
node's mesh dimension), and libraries decide from them who launched the process: Lightning's
``TorchElasticEnvironment`` needs ``TORCHELASTIC_RUN_ID``, ``GROUP_RANK`` and ``LOCAL_WORLD_SIZE`` to
take the processes as started for it, instead of refusing ``strategy="ddp"`` in an interactive
process. A node is a host: ``GROUP_RANK`` is a host's index in rank order, ``LOCAL_WORLD_SIZE`` the
ranks on it. Pure: no engines, no torch. docs/your_stack.md has the table.
"""

from __future__ import annotations

import os

#: torchrun's default ``--role``.
ROLE_NAME = "default"
#: torchrun's default ``--signals-to-handle``.
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def torchrun_env(hosts: list[str], rank: int, run_id: str, threads: int) -> dict[str, str]:
    """Rank ``rank``'s variables in a world whose ranks run on ``hosts`` (one entry per rank, rank order).

    Beside ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, which the
    rendezvous plan sets. ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``: no agent holds a store, rank 0
    serves it (as torchrun's workers do with a static rendezvous). ``TORCHELASTIC_ERROR_FILE`` is not set:
    a rank's error reaches the notebook as its traceback, and torch's ``@record`` needs no file for that."""
    nodes = list(dict.fromkeys(hosts))  # in order of first rank
    host = hosts[rank]
    return {
        "LOCAL_WORLD_SIZE": str(hosts.count(host)),
        "GROUP_RANK": str(nodes.index(host)),
        "GROUP_WORLD_SIZE": str(len(nodes)),
        "ROLE_NAME": ROLE_NAME,
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(len(hosts)),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        # torchrun keeps the caller's value, else sets 1 per worker; pgnb's is its --threads
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
    }
