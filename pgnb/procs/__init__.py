"""Processes of pgnb's own, and what the kernel needs to run them (stdlib, psutil, ipyparallel, pgnb._wire).

A module here is either a process's main or a library, never both:
``zygote`` and ``reaper`` are the processes (run with ``python -c``/``-m``);
``forklauncher`` (the zygote's ipyparallel launcher) and ``reaper_handle``
start and talk to them; ``processes`` (facts about any process) and
``ownership`` (which cluster files are pgnb's) serve both sides;
``spawning`` starts them outside a debugger that traces the kernel;
``prefork`` forks a zygote from the process itself, dormant until a launcher takes it;
``ipcontroller_config`` is a config file for ipyparallel's controller.
"""
