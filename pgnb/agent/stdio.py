"""``pgnb mcp``: the MCP server over stdio, the transport an agent starts itself, holding one warm world.

Only protocol goes to stdout: while serving, the SDK points fd 1 at stderr, so what pgnb,
ipyparallel and the engines it starts print lands there. The world goes with the session:
shut down when the client closes stdin, and killed by its reaper (``pgnb.procs.reaper``)
when the server itself is killed.
"""

from __future__ import annotations

from .hosts import OwnWorld
from .tools import server


def main() -> int:
    host = OwnWorld()
    try:
        server(host).run("stdio")
    except KeyboardInterrupt:
        pass
    finally:
        host.close()
    return 0
