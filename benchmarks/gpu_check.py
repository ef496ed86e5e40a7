"""GPU check: pgnb's NCCL path on a real CUDA machine (not run in `make test`; no GPU here).

``python benchmarks/gpu_check.py`` drives the magics in an InteractiveShell:

1. ``%pg_init --backend nccl --world 1`` and an ``all_reduce`` of a CUDA tensor;
2. ``%pg_init --backend cpu:gloo,cuda:nccl --world N`` (N = visible GPUs, at most 4)
   and ``all_reduce`` on both a CPU and a CUDA tensor;
3. the pre-flight refusal of a world larger than the visible GPUs.

Prints one JSON report; exits 1 if any check failed, 77 if no GPU is visible.
Runs under a fresh temporary IPYTHONDIR.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="pgnb-gpu-check-")


def _cuda_all_reduce() -> dict:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    out = {"rank": rank, "device": str(t.device), "cuda_sum": float(t[0].item()),
           "backend": str(dist.get_backend())}
    if "gloo" in str(dist.get_backend_config()):
        c = torch.full((4,), float(rank + 1))
        dist.all_reduce(c)
        out["cpu_sum"] = float(c[0].item())
    return out


def main() -> int:
    import torch

    n_gpus = torch.cuda.device_count()
    report: dict = {"torch": torch.__version__, "gpus": n_gpus, "checks": []}
    if n_gpus == 0:
        report["skipped"] = "no CUDA GPU visible"
        print(json.dumps(report, indent=2))
        return 77
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    import pgnb

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pgnb")
    ok = True
    world = min(n_gpus, 4)
    for line in ("--backend nccl --world 1", f"--backend cpu:gloo,cuda:nccl --world {world}"):
        check: dict = {"pg_init": line}
        t0 = time.perf_counter()
        try:
            with capture_output() as cap:
                ip.run_line_magic("pg_init", line + " --force")
            check["init_seconds"] = round(time.perf_counter() - t0, 2)
            sb = pgnb.current()
            check["status"] = [repr(r) for r in sb.status()]
            results = sb.run(_cuda_all_reduce)
            n = len(results)
            expected = float(n * (n + 1) // 2)
            check["results"] = results
            check["ok"] = all(r["cuda_sum"] == expected and r.get("cpu_sum", expected) == expected
                              and r["device"] == f"cuda:{r['rank'] % n_gpus}" for r in results)
        except Exception as e:  # report, then go on with the next check
            check["ok"] = False
            check["error"] = f"{type(e).__name__}: {e}"
            check["stderr"] = cap.stderr[-2000:] if "cap" in locals() else ""
        ok &= bool(check["ok"])
        report["checks"].append(check)
    # pre-flight: NCCL cannot put two ranks on one GPU
    check = {"pg_init": f"--backend nccl --world {n_gpus + 1}"}
    try:
        with capture_output():
            ip.run_line_magic("pg_init", check["pg_init"] + " --force")
        check["ok"] = False
    except UsageError as e:
        check["refused"] = str(e)
        check["ok"] = "GPU" in str(e)
    ok &= bool(check["ok"])
    report["checks"].append(check)
    with capture_output():
        ip.run_line_magic("pg_shutdown", "")
    report["ok"] = ok
    print(json.dumps(report, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
