"""``%%pg --trace``'s view: the timeline of a ``Trace``, one swimlane per rank, on the kernel's clock (matplotlib).

Waiting for the slowest participant is hatched, calls that raised or never
returned are outlined in red, calls a rank never made are marked. The picture
is a PNG, which nbval does not compare; its text form has no timings.
matplotlib is a dependency of pgnb; where it is missing all the same, the
picture is replaced by a one-line note rather than an error.
"""

from __future__ import annotations

import io
import math
import textwrap
from typing import Any

from ..core.text import ranks_text
from ..core.trace import ClockOffset, Trace


def timeline(tr: Trace) -> TimelinePicture:
    """The timeline as a PNG that displays in a notebook (and whose text form is deterministic)."""
    n = tr.n_calls
    text = f"<pgnb timeline: {ranks_text(tr.ranks)}, {n} call{'s' if n != 1 else ''}>"
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        return TimelinePicture(b"", text[:-1] + "; no picture: matplotlib is not installed (pip install matplotlib)>")
    fig = figure(tr)
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return TimelinePicture(buf.getvalue(), text)


def figure(tr: Trace) -> Any:
    """The timeline as a matplotlib ``Figure`` (no pyplot: it leaves the user's plots alone)."""
    return _timeline_figure(tr)


def _clock_note(offsets: dict[int, ClockOffset]) -> str:
    measured = [o for o in offsets.values() if o.measured]
    if not measured:
        return "clock offsets not measured"
    fixed = [o for o in measured if o.correction]
    if not fixed:
        worst = max(o.uncertainty for o in measured)
        return f"rank clocks agree with the kernel's within ± {worst * 1e3:.1f} ms (measured)"
    return "clock offsets measured and corrected: " + ", ".join(
        f"rank {o.rank} {_ms(o.offset)}" for o in sorted(fixed, key=lambda o: o.rank))


def _ms(seconds: float) -> str:
    return f"{seconds:+.3f} s" if abs(seconds) >= 1 else f"{seconds * 1e3:+.1f} ms"


class TimelinePicture:
    """A PNG of a trace's timeline; its text form (which nbval compares) has no timings."""

    def __init__(self, png: bytes, text: str) -> None:
        self.png = png
        self.text = text

    def _repr_png_(self) -> bytes | None:
        return self.png or None  # no picture: only the text shows

    def __repr__(self) -> str:
        return self.text

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.png)


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _timeline_figure(tr: Trace) -> Any:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    lanes = list(tr.ranks)
    starts = [c.start for cs in tr.calls.values() for c in cs if c.start is not None]
    origin = min([*tr.began.values(), *starts], default=tr.read_at)
    ends = [c.end if c.end is not None else tr.read_at for cs in tr.calls.values() for c in cs]
    ends += [c.done for cs in tr.calls.values() for c in cs if c.done is not None]
    span = max([*ends, origin + 1e-3]) - origin
    ops = sorted({c.op for cs in tr.calls.values() for c in cs})
    colour = {op: _PALETTE[i % len(_PALETTE)] for i, op in enumerate(ops)}
    fig = Figure(figsize=(10, 1.2 + 0.55 * len(lanes)), dpi=100)
    ax = fig.add_subplot()
    ymap = {r: i for i, r in enumerate(lanes)}
    minw = span * 0.004  # a call of microseconds still shows as a sliver
    labelled = 0
    for r in lanes:
        y = ymap[r]
        ax.axhline(y, color="#e0e0e0", lw=0.8, zorder=0)
        waiting: dict[str, list[tuple[float, float]]] = {}
        working: dict[str, list[tuple[float, float]]] = {}
        for c in tr.calls.get(r, []):
            if c.start is None:
                continue
            s = c.start - origin
            e = (c.end if c.end is not None else tr.read_at) - origin
            w = min(c.wait, max(e - s, 0.0))
            if w > 0:
                waiting.setdefault(c.op, []).append((s, w))
            working.setdefault(c.op, []).append((s + w, max(e - s - w, minw)))
            if c.error or c.end is None:  # outlined in red: it raised, or never returned
                ax.broken_barh([(s, max(e - s, minw))], (y - 0.3, 0.6), facecolors="none",
                               edgecolors="#c62828", lw=1.5, zorder=3)
            if c.done is not None and c.done - origin > e:
                ax.plot([e, c.done - origin], [y, y], color=colour[c.op], lw=1, ls=":")
            label = c.short() + (" (did not return)" if c.end is None else " (raised)" if c.error else "")
            if (e - s) / span > 0.0095 * (len(label) + 2) and labelled < 200:  # only where it fits
                labelled += 1
                ax.text(s + (e - s) / 2, y, label, ha="center", va="center", fontsize=8, zorder=4)
        # one collection per lane and op: thousands of calls draw as fast as a few
        for op, segs in waiting.items():
            ax.broken_barh(segs, (y - 0.3, 0.6), facecolors=colour[op], alpha=0.25, hatch="///",
                           edgecolors=colour[op], lw=0, zorder=1)
        for op, segs in working.items():
            ax.broken_barh(segs, (y - 0.3, 0.6), facecolors=colour[op], lw=0, zorder=2)
    # the last arrival of each collective where someone waited for it
    for step in tr.steps:
        if step.slowest is None:
            continue
        t = step.calls[step.slowest].start
        if t is None:
            continue
        ys = [ymap[r] for r in step.calls if r in ymap]
        ax.plot([t - origin] * 2, [min(ys) - 0.4, max(ys) + 0.4], color="#444", lw=1, ls="--")
        ax.text(t - origin, min(ys) - 0.45, f"rank {step.slowest} arrives {_ms(step.gap).lstrip('+')} after the "
                f"others; {_ms(step.total_wait).lstrip('+')} waited in all ", fontsize=7, ha="right", va="bottom")
    # calls a rank never made
    for step in tr.steps:
        if not step.mismatch:
            continue
        later = [c.start for c in step.calls.values() if c.start is not None]
        x = (min(later) if later else tr.read_at) - origin
        op = next(iter(step.calls.values())).op if step.calls else "call"
        for r in [*step.missing, *step.untraced]:
            if r in ymap:
                ax.text(x, ymap[r], f"✗ never called {op} #{step.number}", color="#c62828", fontsize=8,
                        va="center", ha="left", fontweight="bold")
    ax.set_yticks(range(len(lanes)), [f"rank {r}" for r in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.7)
    ax.set_xlim(0, span * 1.02)
    if span < 1.0:  # short cells read better in milliseconds
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 1e3:g}"))
        ax.set_xlabel("milliseconds since the cell started (kernel clock)")
    else:
        ax.set_xlabel("seconds since the cell started (kernel clock)")
    note = _clock_note(tr.offsets)
    if math.isfinite(tr.noise) and any(s.last is not None for s in tr.steps):
        # what a straggler must stand out from (pgnb.core.trace: STRAGGLER_RATIO, STRAGGLER_FLOOR)
        note += f" · timing noise in this cell {_ms(tr.noise).lstrip('+')}"
    ax.set_title(f"pgnb trace: {ranks_text(lanes)} · {note}", fontsize=9, loc="left")
    handles = [Patch(color=colour[op], label=op) for op in ops]
    if any(c.wait > 0 for cs in tr.calls.values() for c in cs):
        handles.append(Patch(facecolor="white", edgecolor="#555", hatch="///", label="waiting for the last rank"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if tr.problems:  # the first mismatch, in words, under the picture
        text = textwrap.fill(tr.problems[0], 150)
        lines = text.count("\n") + 1
        fig.set_figheight(fig.get_figheight() + 0.2 * lines)
        fig.text(0.01, 0.01, text, color="#c62828", fontsize=8, va="bottom", ha="left")
        fig.tight_layout(rect=(0, 0.04 + 0.045 * lines, 1, 1))
    else:
        fig.tight_layout()
    return fig
