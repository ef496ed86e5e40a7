"""The health probe a warm test world gets before the test that follows a failure.

A rank passes when it answers at all (its engine's main thread is free: no
test is still running there) and, if it holds pgnb's default process group, when
a barrier on that group completes: a group a failure left broken fails the
barrier or, past the probe's deadline, does not answer. The pool
(``pgnb.testing.worlds``) retires a world whose probe fails.
"""

from __future__ import annotations

import datetime


def probe(timeout: float, group: bool = True) -> bool:
    """True when this rank can run the next test (raises, or does not return in time, when not). ``group``:
    also a barrier on the default group (not for torch's suites: the group there is a test's own)."""
    import torch.distributed as dist

    if group and dist.is_initialized():
        work = dist.barrier(async_op=True)
        if work is not None and not work.wait(datetime.timedelta(seconds=timeout)):
            return False
    return True
