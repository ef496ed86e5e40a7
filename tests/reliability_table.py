"""Write docs/reliability.md's tables from what the suite checks, as a run found it.

    python tests/reliability_table.py                 # runs tests/test_reliability.py -> docs/reliability.md
    python tests/reliability_table.py --run-slow tests/test_reliability.py tests/test_soak.py tests/test_chaos.py
    python tests/reliability_table.py -o table.md     # write the tables to a file of their own instead

(``make reliability`` runs the second form.) Only what stands between the
page's ``<!-- reliability:begin -->`` and ``<!-- reliability:end -->`` markers
is replaced. Every row is one test of
``test_fault_*`` (faults survived), ``test_input_*`` (bad input refused),
``test_security_*``, ``test_soak_*`` or ``test_chaos_*``: its docstring says what is checked, the
last column what this run found. Figures a test recorded with
``record_property`` (detection latency, shutdown time, ...) follow the tables.
Any other arguments go to pytest.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PAGE = os.path.join(ROOT, "docs", "reliability.md")
BEGIN, END = "<!-- reliability:begin -->", "<!-- reliability:end -->"

SECTIONS = [
    ("test_fault_", "Faults survived"),
    ("test_input_", "Bad input refused"),
    ("test_security_", "Security"),
    ("test_soak_", "Soak"),
    ("test_chaos_", "Chaos in the control plane"),
]
#: record_property keys -> how the figure reads in the table
FIGURES = {
    "lost_detection_s": "a rank SIGKILLed while idle shown `lost` after (s)",
    "return_after_kill_s": "`%%pg` returned after a rank died mid-`all_reduce` (s after the kill)",
    "timeout_return_s": "`%%pg --timeout 2` on hung ranks returned after (s)",
    "force_recovery_s": "`%pg_init --world 3 --force` recovery took (s)",
    "world8_pgnb_shutdown_s": "pgnb's shutdown of a world of 8 at kernel shutdown (s)",
    "world8_kernel_shutdown_s": "kernel shutdown request to exit, world of 8 (s)",
    "listening_sockets": "listening sockets of a 3-rank world, all on loopback",
    "cycle_s": "soak: one `%pg_init`/`%%pg`/`%pg_destroy` cycle (s)",
    "rss_growth_cycles_pct": "soak: kernel memory after 100 cycles vs after the first 10 (%, limit 10)",
    "force_cycle_s": "soak: one `%pg_init --force`/`%pg_shutdown` cycle (s)",
    "rss_growth_all_pct": "soak: kernel memory after the 20 force cycles too vs after the first 10 (%, limit 10)",
    "interrupt_return_s": "`%pg_init` interrupted 0.3-1.5 s into a cold world 4: the cell returned after (s, slowest)",
    "interrupt_stopped_s": "... and every process it had started was gone after (s from the interrupt, limit 2)",
    "controller_named_s": "controller SIGKILLed: the next `%%pg` named it after (s from the kill, limit 2)",
    "reaper_replaced_s": "reaper SIGKILLed: a new one ran after (s, limit 2)",
    "nothing_left_after_kernel_kill_s": "... then the kernel SIGKILLed: nothing of pgnb's left after (s, limit 10)",
}
#: the chaos tests' figures, for the fixed set (``chaos_``) and the seeded soak (``chaos_soak_``)
for _prefix, _run in (("chaos_", "chaos, fixed set"), ("chaos_soak_", "chaos soak")):
    FIGURES.update({
        f"{_prefix}trials": f"{_run}: trials",
        f"{_prefix}failures": f"{_run}: failed trials",
        f"{_prefix}forced": f"{_run}: trials after which plain `%pg_init` refused (one line) and `--force` recovered",
        f"{_prefix}kinds": f"{_run}: faults by kind (the process killed, or an interrupt)",
        f"{_prefix}phases": f"{_run}: where the faults landed (an interrupted call's phase; else during or after "
                            "the magic)",
        f"{_prefix}slowest_return_s": f"{_run}: slowest one-line failure of a magic after its fault (s, limit 10)",
        f"{_prefix}slowest_recovery_s": f"{_run}: slowest recovery, plain `%pg_init` and a checked `all_reduce` (s)",
    })


@dataclass
class Row:
    name: str
    doc: str
    outcomes: list[str] = field(default_factory=list)
    seconds: float = 0.0


class TablePlugin:
    """Collects each reliability test's docstring, outcome and recorded figures."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.figures: dict[str, Any] = {}

    @staticmethod
    def _key(nodeid: str) -> str:
        return nodeid.split("[", 1)[0]

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
            if not any(name.startswith(prefix) for prefix, _ in SECTIONS):
                continue
            doc = " ".join((getattr(item.obj, "__doc__", None) or "").split("\n\n", 1)[0].split())
            self.rows.setdefault(self._key(item.nodeid), Row(name, doc))

    def pytest_runtest_logreport(self, report: Any) -> None:
        row = self.rows.get(self._key(report.nodeid))
        if row is None:
            return
        row.seconds += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            row.outcomes.append("skipped" if report.skipped else report.outcome)
        for key, value in report.user_properties:
            self.figures[key] = value


def _result(row: Row) -> str:
    if not row.outcomes:
        return "not run"
    if all(o == "skipped" for o in row.outcomes):
        return "skipped (slow: `make soak`)"
    passed = row.outcomes.count("passed")
    text = "passed" if passed == len(row.outcomes) else f"**{len(row.outcomes) - passed} failed**"
    return f"{text} ({passed}/{len(row.outcomes)})" if len(row.outcomes) > 1 else text


def render(plugin: TablePlugin) -> str:
    out = [
        "What pgnb survives and refuses, one row per test of `tests/test_reliability.py`, "
        "`tests/test_soak.py` and `tests/test_chaos.py`; the tables below are written by "
        "`python tests/reliability_table.py` "
        f"(last run: {time.strftime('%Y-%m-%d')}, {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}).",
    ]
    for prefix, title in SECTIONS:
        rows = [r for r in plugin.rows.values() if r.name.startswith(prefix)]
        if not rows:
            continue
        out += ["", f"## {title}", "", "| What is checked | Test | Result |", "|---|---|---|"]
        for r in rows:
            doc = r.doc.replace("|", "\\|")
            out.append(f"| {doc} | `{r.name}` | {_result(r)} |")
    if plugin.figures:
        out += ["", "Measured in that run (2-core machines are noisy; these are one run's figures):", ""]
        for key, value in plugin.figures.items():
            label = FIGURES.get(key)
            if label and not isinstance(value, dict):
                out.append(f"- {label}: {round(value, 2) if isinstance(value, float) else value}")
    return "\n".join(out) + "\n"


def write_into_page(table: str) -> None:
    """Replace what stands between docs/reliability.md's reliability markers."""
    with open(PAGE) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{os.path.relpath(PAGE, ROOT)} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(PAGE, "w") as f:
        f.write(f"{head}{BEGIN}\n{table}{END}{tail}")


def main(argv: list[str]) -> int:
    out_path = PAGE
    if "-o" in argv:
        i = argv.index("-o")
        out_path = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if not any(a.endswith(".py") or "::" in a for a in argv):
        argv = [*argv, os.path.join(HERE, "test_reliability.py")]
    plugin = TablePlugin()
    code = pytest.main(["-p", "no:cacheprovider", *argv], plugins=[plugin])
    if not plugin.rows:
        print("no reliability tests ran; nothing written", file=sys.stderr)
        return int(code) or 1
    if out_path == PAGE:
        write_into_page(render(plugin))
    else:
        with open(out_path, "w") as f:
            f.write(render(plugin))
    print(f"wrote {out_path}")
    return int(code)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main(sys.argv[1:]))
