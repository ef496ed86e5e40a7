"""The agent face: pgnb's world as Model Context Protocol tools (``pgnb mcp``, ``%pg_mcp``); needs ``pgnb[mcp]``.

``tools`` builds the server over a ``hosts.Host`` (the server's own world, or a notebook's);
``report`` makes the answers; ``stdio`` is ``pgnb mcp``; ``http`` serves a notebook's world
over streamable HTTP on 127.0.0.1 behind a bearer token.
"""
