"""Processes of pgnb's own: the fork launcher's zygote and the reaper (stdlib, psutil, ipyparallel, pgnb._wire)."""
