"""``python -m benchmarks``: every row of pgnb's performance table, side by side, in one run.

Each measurement runs in a fresh Python process with a fresh temporary
IPYTHONDIR (``benchmarks/_cases.py``); pgnb and its baseline are interleaved
round by round so background load hits both alike. Prints medians and the
ratio of each row against its target, writes ``benchmarks/results/latest.json``
(every sample) and ``benchmarks/results/latest.md`` (the table docs/performance.md shows).
A run of part of it (``--quick``, ``--only``) writes ``partial.json`` and ``partial.md`` there
instead: the record of the last full run stays as it is.

    python -m benchmarks                 # the full run (~15 min on 2 cores, ~10 of them torch's own
                                         # spawning of benchmarks/dist_suite); updates docs/performance.md
    python -m benchmarks --quick         # one sample of each, smaller loops (~2-3 min); docs untouched
    python -m benchmarks --no-docs       # a full run that leaves docs/performance.md as it is
    python -m benchmarks --only torch_distributed,torch_continuous
                                         # only these cases and their rows; docs untouched
    python -m benchmarks --only torch_distributed --sample 48
                                         # 48 of DistributedTest's tests, both ways

A full run replaces only what stands between docs/performance.md's ``<!-- bench:begin -->``
and ``<!-- bench:end -->`` markers, and the README's few headline rows between its
``<!-- bench-summary:begin -->`` and ``<!-- bench-summary:end -->`` markers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil

from benchmarks._runner import ROOT, run_case
from benchmarks.resolver import isolated_net_missing

RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGE = os.path.join(ROOT, "docs", "performance.md")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
README = os.path.join(ROOT, "README.md")
SUMMARY_BEGIN, SUMMARY_END = "<!-- bench-summary:begin -->", "<!-- bench-summary:end -->"


# --------------------------------------------------------------------------- the plan


def plan(quick: bool) -> dict[str, Any]:
    if quick:
        return {"warmup": False, "rounds": 1, "rounds_w8_local": 0, "cell_repeats": 20, "reinit_cycles": 2,
                "ar_rounds": 1, "sizes": [[1 << 20, 20, 3, 3], [1 << 24, 3, 1, 2]],
                "scale": {"worlds": [2, 8, 32], "cells": 5, "queries": 2},
                "live": {"latency_lines": 40, "flood_rounds": 1, "cell_repeats": 10, "compute_seconds": 4.0},
                "torch_suite": {"keyword": "CollectivesWorld2"}, "world_marker": {"trivial": 20},
                "torch_distributed": {"sample": 10}, "torch_continuous": {}, "torch_unseen": {},
                "inner_loop": {"rounds": 1}}
    return {"warmup": True, "rounds": 3, "rounds_w8_local": 2, "cell_repeats": 60, "reinit_cycles": 4,
            "ar_rounds": 3, "sizes": [[1 << 20, 40, 5, 5], [1 << 24, 5, 2, 3]],
            "scale": {"worlds": [2, 4, 8, 16, 32, 64], "cells": 20, "queries": 5},
            "live": {"latency_lines": 60, "flood_rounds": 3, "cell_repeats": 30, "compute_seconds": 10.0},
            "torch_suite": {}, "world_marker": {}, "torch_distributed": {}, "torch_continuous": {}, "torch_unseen": {},
            "inner_loop": {"rounds": 2}}

#: The cases ``--only`` can name: torch's own suites, torch's harnesses vs --pgnb-torch (benchmarks/torch_harnesses.py)
ONLY = ("torch_distributed", "torch_continuous", "torch_unseen", "inner_loop")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def collect(p: dict[str, Any], only: list[str] | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {}

    def sample(key: str, case: str, **kwargs: Any) -> None:
        r = run_case(case, **kwargs)
        raw.setdefault(key, []).append(r)
        shown = r.get("init", r.get("cold_init", 0.0))
        log(f"  {key:<18} {shown:6.2f} s   (load {r['_load']:.1f}, case {r['_wall']:.1f} s)")

    if only is not None:
        harness_samples(p, only, sample)
        return raw
    if p["warmup"]:  # page cache, .pyc files, the first-ever zygote: not measured
        log("warm-up")
        for launcher in ("fork", "local"):
            run_case("pgnb_cold", world=4, launcher=launcher)
    for rnd in range(p["rounds"]):
        log(f"cold init, world 4, round {rnd + 1}/{p['rounds']}")
        sample("w4_fork", "pgnb_cold", world=4, launcher="fork")
        sample("w4_plain", "plain_cold", n=4)
        sample("w4_local", "pgnb_cold", world=4, launcher="local")
    for rnd in range(p["rounds"]):
        log(f"cold init, world 8, round {rnd + 1}/{p['rounds']}")
        sample("w8_fork", "pgnb_cold", world=8, launcher="fork")
        sample("w8_plain", "plain_cold", n=8)
        if rnd < p["rounds_w8_local"]:
            sample("w8_local", "pgnb_cold", world=8, launcher="local")
    log("warm rows on one world of 4: %%pg vs %%px, all_reduce vs torchrun, memory, re-init, shutdown")
    sample("session", "session", world=4, cell_repeats=p["cell_repeats"], sizes=p["sizes"],
           reinit_cycles=p["reinit_cycles"], rounds=p["ar_rounds"])
    sc = p["scale"]
    log(f"scale: worlds {sc['worlds']}, each cold, then its cells beside %%px, queries, shutdown")
    for w in sc["worlds"]:
        sample(f"scale_w{w}", "scale", world=w, cells=sc["cells"] if w <= 16 else max(5, sc["cells"] // 2),
               queries=sc["queries"])
    resolver_samples(max(sc["worlds"]), sample)
    log("Slurm: %pg_init --launcher slurm --world 4 beside --launcher fork, on the tests' one-node cluster")
    sample("slurm_cold", "slurm_cold", world=4, rounds=p["rounds"])
    log("live %%pg in a Jupyter kernel: latency, a print flood vs %%px --stream, a trivial cell, a compute loop")
    sample("live", "live", world=4, **p["live"])
    log("torch's MultiProcessTestCase suite (benchmarks/dist_suite): torch's own spawning, then pytest --pgnb-torch")
    sample("torch_suite", "torch_suite", **p["torch_suite"])
    log("the pytest plugin: trivial @pytest.mark.world(4) tests on a warm world, a hung test, the test after it")
    sample("world_marker", "world_marker", **p["world_marker"])
    harness_samples(p, list(ONLY), sample)
    return raw


def resolver_samples(world: int, sample: Any) -> None:
    """The resolver's share of the biggest world's start (benchmarks/resolver.py): that world again with no DNS
    server to ask, and plain torch's init of as many forked ranks, both ways."""
    if missing := isolated_net_missing():
        log(f"the resolver's share: not measured ({missing})")
        return
    log(f"the resolver's share: world {world} cold with no DNS server to ask; plain torch's {world} ranks both ways")
    sample(f"w{world}_no_dns", "pgnb_cold", isolated_net=True, world=world)
    sample("torch_init_here", "torch_forked_init", n=world)
    sample("torch_init_no_dns", "torch_forked_init", isolated_net=True, n=world)


def harness_samples(p: dict[str, Any], only: list[str], sample: Any) -> None:
    """torch's own suites under torch's two harnesses and under --pgnb-torch (benchmarks/torch_harnesses.py)."""
    if "torch_distributed" in only:
        log("torch's DistributedTest suite (gloo, world 2): torch's spawning, then pytest --pgnb-torch")
        sample("torch_distributed", "torch_distributed", **p["torch_distributed"])
    if "torch_continuous" in only:
        log("MultiProcContinuousTest classes (worlds 1, 2 and 4): torch's continuous harness, then pytest --pgnb-torch")
        sample("torch_continuous", "torch_continuous", **p["torch_continuous"])
    if "torch_unseen" in only:
        log("four more of torch's DTensorContinuousTestBase files, never measured before: the same two ways")
        sample("torch_unseen", "torch_unseen", **p["torch_unseen"])
    if "inner_loop" in only:
        log("one DistributedTest test from the command line: torch's spawning, --pgnb-torch, --pgnb-keep twice")
        sample("inner_loop", "inner_loop", **p["inner_loop"])


# --------------------------------------------------------------------------- summary


def _med(samples: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(s[key] for s in samples))


def summarize(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measure: pgnb's figure, the baseline's, their ratio, the target and whether it is met."""
    rows: list[dict[str, Any]] = []

    def row(measure: str, pgnb: float, base: float | None, unit: str, target: str, met: bool,
            ratio: float | None = None, note: str = "", headline: tuple[str, str] | None = None) -> None:
        if ratio is None and base:
            ratio = pgnb / base
        rows.append({"measure": measure, "pgnb": pgnb, "baseline": base, "unit": unit,
                     "ratio": ratio, "target": target, "met": met, "note": note, "headline": headline})

    if set(raw) <= set(ONLY):  # --only
        harness_rows(raw, row)
        return rows
    s = raw["session"][0]
    for w in (4, 8):
        fork, plain = _med(raw[f"w{w}_fork"], "init"), _med(raw[f"w{w}_plain"], "init")
        n = len(raw[f"w{w}_fork"])
        row(f"cold `%pg_init --world {w}` (fork launcher) vs plain ipyparallel script", fork, plain, "s",
            "≤ 0.25×", fork / plain <= 0.25, note=f"median of {n}",
            headline=(f"`%pg_init --world {w}` from nothing", "the same world from a plain ipyparallel script"))
        if raw.get(f"w{w}_local"):
            local = _med(raw[f"w{w}_local"], "init")
            row(f"cold `%pg_init --world {w} --launcher local` vs plain script", local, plain, "s",
                "(for comparison)", True, note=f"median of {len(raw[f'w{w}_local'])}")
    cold = _med(raw["w4_fork"], "init")
    reinit = s["reinit"]["median"]
    row("re-init on live engines (init method / world 4→2→4), median", reinit, cold, "s",
        "≤ 0.3 s and ≤ 0.05× cold", reinit <= 0.3 and reinit / cold <= 0.05,
        note=f"{s['reinit']['samples']} re-inits, max {s['reinit']['max']:.3f} s; baseline: pgnb's cold init")
    pg, px = s["cell"]["pg"]["median"], s["cell"]["px"]["median"]
    row("`%%pg` trivial cell, world 4, vs `%%px` on the same engines", pg, px, "s", "≤ 1.0×", pg / px <= 1.0,
        note=f"median of {s['cell']['pg']['samples']} alternating samples each",
        headline=("a trivial `%%pg` cell, 4 ranks", "`%%px` on the same engines"))
    for numel, label in (("1048576", "1M"), ("16777216", "16M")):
        a, b = s["allreduce"]["pg"][numel], s["allreduce"]["torchrun"][numel]
        gbps_pg = int(numel) * 4 / a["seconds_per_op"] / 1e9
        gbps_tr = int(numel) * 4 / b["seconds_per_op"] / 1e9
        row(f"all_reduce {label} float32, world 4, in `%%pg` vs torchrun (gloo), algbw", gbps_pg, gbps_tr, "GB/s",
            "≥ 0.95×", gbps_pg / gbps_tr >= 0.95,
            headline=(f"`all_reduce` of {label} floats in `%%pg`, 4 ranks (bandwidth)", "the same under torchrun")
            if label == "16M" else None,
            note=f"{a['seconds_per_op'] * 1e3:.1f} vs {b['seconds_per_op'] * 1e3:.1f} ms/op, median of "
                 f"{a['blocks']} vs {b['blocks']} timed blocks")
    stop, pstop = _med(raw["w4_fork"], "stop"), _med(raw["w4_plain"], "stop")
    row("`%pg_shutdown`, world 4, vs ipyparallel `stop_cluster` defaults", stop, pstop, "s", "≤ 0.3×",
        stop / pstop <= 0.3, headline=("`%pg_shutdown`, 4 ranks", "ipyparallel's `stop_cluster`"))
    gone, pgone = _med(raw["w4_fork"], "all_exited"), _med(raw["w4_plain"], "all_exited")
    row("… until every process has exited", gone, pgone, "s", "(for comparison)", True)
    mem, pmem = s["memory"], _mem_median(raw["w4_plain"])
    row("USS per engine after `import torch` + init, world 4", mem["engine_uss_mb"], pmem["engine_uss_mb"], "MB",
        "≤ 0.5×", mem["engine_uss_mb"] / pmem["engine_uss_mb"] <= 0.5,
        note="fork: pages shared with the zygote are not in USS")
    row("PSS per engine", mem["engine_pss_mb"], pmem["engine_pss_mb"], "MB", "(honest share)", True)
    row("whole world's PSS / rank (engines, nannies, zygote)", mem["world_pss_per_rank_mb"],
        pmem["world_pss_per_rank_mb"], "MB", "(honest share)", True,
        headline=("memory per rank (PSS of engines, nannies and zygote)", "plain ipyparallel engines"))
    scale_rows(raw, row)
    sl = raw["slurm_cold"][0]
    if "skipped" not in sl:
        row("cold `%pg_init --launcher slurm --world 4` (a zygote per node) vs `--launcher fork`",
            sl["init"], statistics.median(sl["fork"]), "s", "≤ 2×", sl["ratio"] <= 2 and not sl["jobs_left"],
            note=f"the tests' one-node Slurm cluster, median of {len(sl['slurm'])} interleaved; "
                 f"jobs left: {len(sl['jobs_left'])}")
    lv = raw["live"][0]
    lat = lv["latency"]
    row("live `%%pg`: a rank's print to the kernel sending it, 4 ranks, a line every 50 ms (median)",
        lat["median"], None, "s", "≤ 100 ms", lat["median"] <= 0.1,
        note=f"{lat['lines']} of {lat['expected']} lines seen live; in a Jupyter kernel",
        headline=("a rank's `print` reaching the notebook's live view (median)", ""))
    row("… 95th percentile", lat["p95"], None, "s", "≤ 250 ms", lat["p95"] <= 0.25)
    fl = lv["flood"]
    row("20,000 lines on each of 4 ranks: `%%pg` (live) vs `%%px --stream`", fl["pg"], fl["px"], "s", "≤ 1.2×",
        fl["pg"] / fl["px"] <= 1.2, note="same engines, same kernel, alternating")
    ce = lv["cell"]
    row("`%%pg` trivial cell in a kernel (live view included) vs `%%px`", ce["pg"], ce["px"], "s", "≤ 1.05×",
        ce["pg"] / ce["px"] <= 1.05)
    co = lv["compute"]
    row("a rank's compute-only loop, watched by `%%pg` vs under `%%px`", co["pg"], co["px"], "s", "≤ 1.02×",
        co["pg"] / co["px"] <= 1.02, note="median of the 4 ranks' own loop times; stacks sampled after 2 s")
    ts = raw["torch_suite"][0]
    same = "the same verdicts both ways" if ts["same_verdicts"] else f"verdicts differ: {', '.join(ts['differ'])}"
    row(f"torch's own suite: {ts['tests']} `MultiProcessTestCase` tests (world 2 and 4), `pytest --pgnb-torch` "
        "vs torch's spawning", ts["pgnb"]["wall"], ts["spawn"]["wall"], "s", "≤ 0.033× (30× less), same verdicts",
        ts["ratio"] <= 1 / 30 and ts["same_verdicts"],
        note=f"whole pytest runs; {ts['passed']} passed, {ts['skipped']} skipped, {ts['failed']} failed, {same}; "
             f"a test's median {ts['pgnb']['per_test_median'] * 1e3:.0f} ms vs {ts['spawn']['per_test_median']:.1f} s")
    wm = raw["world_marker"][0]
    row("a trivial `@pytest.mark.world(4)` test on a warm world (pytest's own time per test, median)",
        wm["per_test_median"], None, "s", "≤ 50 ms", wm["trivial_passed"] and wm["per_test_median"] <= 0.05,
        note=f"{wm['trivial']} tests in one session, 90th percentile {wm['per_test_p90'] * 1e3:.0f} ms; "
             "one cell on every rank, the leak checks and the reseed included")
    row(f"a hung world-4 test (`timeout={wm['hang_timeout']:g}`): its cost, and the test after it",
        wm["hang_seconds"], None, "s", "≤ timeout + 3 s, the next test passes",
        wm["hang_outcome"] == "failed" and wm["hang_seconds"] <= wm["hang_timeout"] + 3
        and wm["after_outcome"] == "passed",
        note=f"failed with every rank's stack; the next test {wm['after_outcome']} on the fresh world "
             f"in {wm['after_seconds'] * 1e3:.0f} ms")
    harness_rows(raw, row)
    return rows


def harness_rows(raw: dict[str, Any], row: Any) -> None:
    """The rows of torch's DistributedTest suite and of the continuous classes, each beside torch's harness."""
    if raw.get("torch_distributed"):
        td = raw["torch_distributed"][0]
        same = "the same verdicts" if td["same_verdicts"] else f"verdicts differ: {', '.join(td['differ'])}"
        what = f"a sample of {td['tests']}" if td["sample"] else f"all {td['tests']}"
        row(f"torch's `DistributedTest` suite (gloo, world 2; {what} tests), `pytest --pgnb-torch` vs torch's "
            "spawning", td["pgnb"]["wall"], td["spawn"]["wall"], "s", "≤ 0.05× (20× less), same verdicts",
            td["ratio"] <= 0.05 and td["same_verdicts"],
            note=f"whole pytest runs; {td['passed']} passed, {td['skipped']} skipped, {td['failed']} failed, {same}; "
                 f"a test's median {td['pgnb']['per_test_median'] * 1e3:.0f} ms vs "
                 f"{td['spawn']['per_test_median']:.1f} s")
    if raw.get("torch_continuous"):
        tc = raw["torch_continuous"][0]
        same = "the same verdicts" if tc["same_verdicts"] else f"verdicts differ: {', '.join(tc['differ'])}"
        row(f"{tc['classes']} `MultiProcContinuousTest` classes, {tc['tests']} tests (worlds 1, 2 and 4), "
            "`pytest --pgnb-torch` vs torch's continuous harness", tc["pgnb"]["wall"], tc["spawn"]["wall"], "s",
            "≤ 0.33× (3× less), same verdicts", tc["ratio"] <= 1 / 3 and tc["same_verdicts"],
            note=f"whole pytest runs; {tc['passed']} passed, {tc['skipped']} skipped, {tc['failed']} failed, {same}")
        row("a trivial `MultiProcContinuousTest` test under `--pgnb-torch` (pytest's own time per test, median)",
            tc["trivial_median"], None, "s", "≤ 30 ms", tc["trivial_median"] <= 0.03,
            note=f"{tc['trivial_tests']} tests of one class at world 2, in the run above")
    if raw.get("torch_unseen"):
        tu = raw["torch_unseen"][0]
        same = "the same verdicts" if tu["same_verdicts"] else f"verdicts differ: {', '.join(tu['differ'])}"
        row(f"{tu['classes']} more `DTensorContinuousTestBase` classes of torch's, {tu['tests']} tests (benchmarks/"
            "torch_unseen, taken after the rows above were measured), `pytest --pgnb-torch` vs torch's continuous "
            "harness", tu["pgnb"]["wall"], tu["spawn"]["wall"], "s", "≤ 0.33× (3× less), same verdicts",
            tu["ratio"] <= 1 / 3 and tu["same_verdicts"],
            note=f"whole pytest runs; {tu['passed']} passed, {tu['skipped']} skipped, {tu['failed']} failed, {same}")
    if raw.get("inner_loop"):
        il = raw["inner_loop"][0]
        m = il["median"]
        runs = f"median of {il['rounds']} round{'s' if il['rounds'] > 1 else ''}, each from process start"
        row("one `DistributedTest` test run again after touching its file, `pytest --pgnb-torch --pgnb-keep` "
            "(the kept process's second run) vs torch's spawning", m["keep_second"], m["spawn"], "s", "≤ 0.5×",
            il["second_ratio"] <= 0.5, note=f"{runs}; the second run at once after the first")
        row(f"the same, the second run {il['pause']:g} s after the first (the time of an edit; the kept process "
            "warms up meanwhile)", m["keep_second_paused"], m["spawn"], "s", "≤ 0.5×", il["paused_ratio"] <= 0.5,
            note=runs)
        row("the same test's first `--pgnb-keep` run (nothing kept: it runs cold and starts the kept process) vs "
            "torch's spawning", m["keep_first"], m["spawn"], "s", "≤ 1×", il["first_ratio"] <= 1.0,
            note=f"{runs}; `--pgnb-torch` without the option, cold: {il['cold_ratio']:.2f}×")


def scale_of(raw: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The scale case's samples by world size."""
    return {int(k[len("scale_w"):]): v[0] for k, v in raw.items() if k.startswith("scale_w")}


def scale_rows(raw: dict[str, Any], row: Any) -> None:
    """The main table's rows for the biggest world: its cold start, shutdown, a cell beside ``%%px``, growth."""
    by_world = scale_of(raw)
    big, small = max(by_world), min((w for w in by_world if w >= 4), default=min(by_world))
    b, s = by_world[big], by_world[small]
    row(f"cold `%pg_init --world {big}` (oversubscribed), all_reduce checked on every rank", b["init"], None, "s",
        "≤ 8 s, all_reduce correct", b["init"] <= 8 and b["allreduce_correct"],
        headline=(f"`%pg_init --world {big}` from nothing, on 2 cores", ""),
        note=f"all_reduce correct: {b['allreduce_correct']}; the rendezvous (torch's gloo mesh of "
             f"{big * (big - 1) // 2} pairs) from {b['phases'].get('rendezvous', float('nan')):.2f} s")
    if (alone := raw.get(f"w{big}_no_dns")) and raw.get("torch_init_here") and raw.get("torch_init_no_dns"):
        here, no_dns = raw["torch_init_here"][0], raw["torch_init_no_dns"][0]
        row("… the same with no DNS server to ask (a network namespace with loopback only), vs here",
            alone[0]["init"], b["init"], "s", "(the resolver's share)", True,
            note=f"plain torch, {big} forked ranks' init_process_group: {here['init']:.2f} s here ({here['waited']} "
                 f"of {big} ranks waited over 4 s), {no_dns['init']:.2f} s with no DNS server to ask")
    row(f"`%pg_shutdown`, world {big}, until every process has exited", b["all_exited"], None, "s",
        "≤ 2 s, nothing left", b["all_exited"] <= 2 and b["left_running"] == 0 and b["killed"] == 0,
        note=f"left running {b['left_running']}, killed {b['killed']:.0f}")
    pg, px = b["trivial"]["pg"], b["trivial"]["px"]
    row(f"`%%pg` trivial cell, world {big}, vs `%%px` on the same engines", pg, px, "s", "≤ 2×", pg / px <= 2)
    growth_pg, growth_px = pg / s["trivial"]["pg"], px / s["trivial"]["px"]
    row(f"… its growth from world {small} to {big}, vs `%%px`'s", growth_pg, growth_px, "×",
        "no steeper than `%%px`'s", growth_pg <= growth_px,
        note=f"world {small}: {s['trivial']['pg'] * 1e3:.1f} vs {s['trivial']['px'] * 1e3:.1f} ms")


#: The scale table's rows: (label, the value of one world's sample, the %%px twin's or None).
SCALE_TABLE: list[tuple[str, Any, Any]] = [
    ("cold `%pg_init`", lambda r: r["init"], None),
    ("… of which the rendezvous (torch's init)", lambda r: r["init"] - r["phases"].get("rendezvous", r["init"]), None),
    ("re-init on the live engines", lambda r: r["reinit"], None),
    ("trivial cell (`x = 1`)", lambda r: r["trivial"]["pg"], lambda r: r["trivial"]["px"]),
    ("a cell printing one line per rank", lambda r: r["print"]["pg"], lambda r: r["print"]["px"]),
    ("`%pg_status`", lambda r: r["status"], None),
    ("`%pg_show t` (1k floats)", lambda r: r["show"], None),
    ("a traced all_reduce cell (`--trace`)", lambda r: r["traced"], None),
    ("`%pg_shutdown`, all exited", lambda r: r["all_exited"], None),
]


def scale_markdown(raw: dict[str, Any]) -> str:
    """The table of cost against world size, and how each row grows (the log-log slope from 4 ranks up)."""
    by_world = scale_of(raw)
    worlds = sorted(by_world)
    lines = ["| world | " + " | ".join(str(w) for w in worlds) + " | growth |",
             "|---|" + "---:|" * len(worlds) + "---:|"]

    def cells(fn: Any) -> tuple[list[str], str]:
        values = [fn(by_world[w]) for w in worlds]
        return [_fmt(v, "s") for v in values], _slope(worlds, values)

    for label, pg, px in SCALE_TABLE:
        shown, slope = cells(pg)
        lines.append(f"| {label} | " + " | ".join(shown) + f" | {slope} |")
        if px is not None:
            shown, slope = cells(px)
            lines.append("| … `%%px` on the same engines | " + " | ".join(shown) + f" | {slope} |")
    mem = [by_world[w]["memory"] for w in worlds]
    lines.append("| USS per engine | " + " | ".join(f"{m['engine_uss_mb']:.0f} MB" for m in mem) + " | |")
    lines.append("| whole world's PSS / rank | " + " | ".join(f"{m['world_pss_per_rank_mb']:.0f} MB" for m in mem)
                 + " | |")
    ok = all(by_world[w]["allreduce_correct"] and by_world[w]["left_running"] == 0 for w in worlds)
    lines += ["", f"Every world's all_reduce was correct on every rank and nothing was left running: {ok}. "
              "Growth: the slope of log(cost) against log(world) from world 4 up (1.0 is linear)."]
    return "\n".join(lines) + "\n"


def _slope(worlds: list[int], values: list[float]) -> str:
    import math

    pts = [(math.log(w), math.log(v)) for w, v in zip(worlds, values, strict=True) if w >= 4 and v > 0]
    if len(pts) < 2:
        return "—"
    mx, my = statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return f"{sum((x - mx) * (y - my) for x, y in pts) / den:.2f}"


def scale_plot(raw: dict[str, Any], path: str) -> None:
    """Cost against world size, log-log, from the same run: pgnb's rows, and %%px's beside its cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_world = scale_of(raw)
    worlds = sorted(by_world)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=100)
    for label, pg, px in SCALE_TABLE:
        line, = ax.plot(worlds, [pg(by_world[w]) for w in worlds], marker="o", label=label.replace("`", ""))
        if px is not None:
            ax.plot(worlds, [px(by_world[w]) for w in worlds], marker="x", linestyle="--", color=line.get_color(),
                    label="… %%px")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(worlds, [str(w) for w in worlds])
    ax.set_xlabel("ranks (world size), on 2 cores: oversubscribed above 2")
    ax.set_ylabel("seconds")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _mem_median(samples: list[dict[str, Any]]) -> dict[str, float]:
    keys = samples[0]["memory"].keys()
    return {k: float(statistics.median(s["memory"][k] for s in samples)) for k in keys}


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"
    if unit == "MB":
        return f"{v:.0f} MB"
    return f"{v:.2f} {unit}"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], raw: dict[str, Any]) -> str:
    lines = [
        f"Measured {meta['date']} on {meta['cores']} cores ({meta['cpu']}), {meta['memory_gib']:.0f} GiB, "
        f"torch {meta['torch']} (CPU), ipyparallel {meta['ipyparallel']}, Python {meta['python']}; "
        f"`python -m benchmarks{' --quick' if meta['quick'] else ''}`, load average "
        f"{meta['load_min']:.1f}–{meta['load_max']:.1f} during the run ({meta['duration_s'] / 60:.1f} min).",
        "",
        "| measure | pgnb | baseline | ratio | target | met |",
        "|---|---:|---:|---:|---|:---:|",
    ]
    for r in rows:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        met = "" if r["target"].startswith("(") else ("yes" if r["met"] else "**no**")
        measure = r["measure"] + (f" <br><sub>{r['note']}</sub>" if r["note"] else "")
        lines.append(f"| {measure} | {_fmt(r['pgnb'], r['unit'])} | {_fmt(r['baseline'], r['unit'])} | "
                     f"{ratio} | {r['target']} | {met} |")
    if any(raw.get(f"w{w}_plain") for w in (4, 8)):  # not in a run of --only
        lines += ["", "Where the cold time goes (medians, seconds from the start of the call):", "",
                  "| world | launcher | engines registered | torch imported | initialized | shutdown |",
                  "|---:|---|---:|---:|---:|---:|"]
    for w in (4, 8):
        for launcher in ("fork", "local"):
            samples = raw.get(f"w{w}_{launcher}")
            if not samples:
                continue
            reg = statistics.median(s["phases"].get("importing torch", float("nan")) for s in samples)
            rdv = statistics.median(s["phases"].get("rendezvous", float("nan")) for s in samples)
            lines.append(f"| {w} | pgnb `{launcher}` | {reg:.2f} | {rdv:.2f} | {_med(samples, 'init'):.2f} | "
                         f"{_med(samples, 'stop'):.2f} |")
        samples = raw.get(f"w{w}_plain")
        if not samples:  # a run of --only
            continue
        up = statistics.median(s["phases"]["engines_up"] for s in samples)
        imp = statistics.median(s["phases"]["engines_up"] + s["phases"]["torch_imported"] for s in samples)
        lines.append(f"| {w} | plain ipyparallel | {up:.2f} | {imp:.2f} | {_med(samples, 'init'):.2f} | "
                     f"{_med(samples, 'stop'):.2f} |")
    if scale_of(raw):
        lines += ["", "Cost against world size, from the same run (each world cold in a fresh Python; on 2 cores "
                  "every world above 2 is oversubscribed, so a cost that grows linearly is the machine's, not "
                  "pgnb's; [the plot](scale.png)):", "", scale_markdown(raw).rstrip("\n")]
    return "\n".join(lines) + "\n"


def machine(quick: bool) -> dict[str, Any]:
    import ipyparallel
    import torch

    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(), "cpu": cpu,
            "memory_gib": psutil.virtual_memory().total / 2**30, "torch": torch.__version__.split("+")[0],
            "ipyparallel": ipyparallel.__version__, "python": platform.python_version(), "quick": quick,
            "commit": commit}


def headline(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The README's few rows: what a user waits for, beside what they would use instead."""
    lines = ["| | pgnb | instead | ratio |", "|---|---:|---:|---:|"]
    for r in rows:
        if not r["headline"]:
            continue
        what, instead = r["headline"]
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        base = f"{_fmt(r['baseline'], r['unit'])} ({instead})" if r["baseline"] else "—"
        lines.append(f"| {what} | {_fmt(r['pgnb'], r['unit'])} | {base} | {ratio} |")
    lines += ["", f"*`python -m benchmarks` on {meta['date']}, {meta['cores']} cores, torch {meta['torch']} (CPU), "
              f"load {meta['load_min']:.1f}–{meta['load_max']:.1f}; every row and its target: "
              "[docs/performance.md](docs/performance.md).*"]
    return "\n".join(lines) + "\n"


def _replace_between(path: str, begin: str, end: str, text: str) -> None:
    with open(path) as f:
        page = f.read()
    if begin not in page or end not in page:
        raise SystemExit(f"{os.path.relpath(path, ROOT)} has no {begin} ... {end} markers")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{text}{end}{tail}")


def update_docs(table: str, summary: str) -> None:
    """Replace what stands between docs/performance.md's bench markers and the README's summary markers."""
    _replace_between(PAGE, BEGIN, END, table)
    _replace_between(README, SUMMARY_BEGIN, SUMMARY_END, summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one sample of each row, smaller loops")
    parser.add_argument("--out", default=RESULTS,
                        help="folder for latest.json and latest.md (partial.json and partial.md: --quick, --only)")
    parser.add_argument("--no-docs", action="store_true",
                        help="do not put the table into docs/performance.md (a --quick run never does)")
    parser.add_argument("--only", type=lambda text: text.split(","), default=None,
                        help=f"run only these cases, comma-separated ({', '.join(ONLY)}); docs untouched")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="torch's DistributedTest suite: N tests spread over it, both ways (its 285 tests "
                             "under torch's spawning take 30-40 min on 2 cores)")
    args = parser.parse_args(argv)
    if args.only is not None and not set(args.only) <= set(ONLY):
        parser.error(f"--only takes {', '.join(ONLY)}, not {', '.join(sorted(set(args.only) - set(ONLY)))}")

    p = plan(args.quick)
    if args.sample is not None:
        p["torch_distributed"]["sample"] = args.sample
    meta = machine(args.quick)
    t0 = time.perf_counter()
    loads = [os.getloadavg()[0]]
    raw = collect(p, args.only)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "raw.json"), "w") as f:  # every sample, before anything can fail on them
        json.dump({"meta": meta, "raw": raw}, f)
    loads += [r["_load"] for samples in raw.values() for r in samples] + [os.getloadavg()[0]]
    meta.update(duration_s=time.perf_counter() - t0, load_min=min(loads), load_max=max(loads), plan=p)
    rows = summarize(raw)
    table = markdown(rows, meta, raw)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    name = "partial" if args.quick or args.only else "latest"  # a part never stands for the last full run
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "raw": raw}, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(table)
    os.remove(os.path.join(args.out, "raw.json"))  # the .json has it all now
    if scale_of(raw):
        scale_plot(raw, os.path.join(args.out, "scale.png" if name == "latest" else "partial-scale.png"))
    if not (args.quick or args.no_docs or args.only):
        update_docs(table, headline(rows, meta))
        if scale_of(raw):
            scale_plot(raw, os.path.join(ROOT, "docs", "scale.png"))
    targets = [r for r in rows if not r["target"].startswith("(")]
    missed = [r["measure"] for r in targets if not r["met"]]
    log(f"{len(targets) - len(missed)}/{len(targets)} targets met" + (f"; missed: {missed}" if missed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
