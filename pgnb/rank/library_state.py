"""What training libraries keep about the world in their own module state, forgotten when a world ends.

Under torchrun a process serves one world and dies. A rank lives on through ``%pg_destroy`` and through a
re-init at another size, so a library's per-process singleton would go on describing the old world: HF
Accelerate's ``PartialState`` (which ``Accelerator`` and the HF ``Trainer`` read) keeps ``num_processes``,
and its ``gather`` then expects the old size ("invalid output tensor list ... expected length 4, got 2").
Only libraries already imported are touched; none is imported here.
"""

from __future__ import annotations

import sys


def forget_world() -> None:
    """Drop the libraries' cached view of the world; the next ``Accelerator()`` reads the new one."""
    accelerate_state = sys.modules.get("accelerate.state")
    # the reset accelerate's own tests use between worlds (a private name, in pgnb/_private_names.py);
    # a release without it leaves the old state, as before pgnb knew of it, rather than fail every init
    reset = getattr(getattr(accelerate_state, "AcceleratorState", None), "_reset_state", None)
    if reset is not None:
        reset(reset_partial_state=True)
