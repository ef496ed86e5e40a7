"""Runs inside the ipyparallel engines (the ranks): imports torch and pgnb._wire, never the kernel side."""
