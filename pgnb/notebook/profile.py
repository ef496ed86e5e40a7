"""``%%pg --profile``'s view: a per-rank table with the times, beside the deterministic text.

The HTML shows what the text leaves out because it differs between runs:
per rank, time in the backend's collectives vs in other ops (with a bar),
peak memory, and the ops with the most self time. The ``text/plain``
(``pgnb.core.profile.Profile.text``) has names and counts only, for nbval.
The HTML travels as an ipywidgets HTML widget, not as ``text/html``: strict
nbval compares a display's ``text/html`` too, but never a widget's state.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from ..core.profile import Profile


class ProfileView(W.HTML):  # type: ignore[misc]
    """What ``%%pg --profile`` displays: the HTML table (a widget), and the text table beside it."""

    def __init__(self, profile: Profile) -> None:
        super().__init__(value=to_html(profile))
        self.profile = profile

    def __repr__(self) -> str:
        return self.profile.text()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.profile.text()  # not ipywidgets' repr
        return bundle


def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms" if us >= 100 else f"{us:.0f} µs"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def to_html(p: Profile) -> str:
    th = "padding:2px 8px;text-align:left;font-weight:normal;color:#666"
    td = "padding:2px 8px;text-align:left;vertical-align:top"
    out = ['<div class="pgnb-profile" style="display:inline-block;font-family:monospace;font-size:12px">',
           f'<div style="margin-bottom:4px">{html.escape(p.header())}</div>',
           '<table style="border-collapse:collapse">', "<tr>"]
    cols = ("rank", "ops", "collectives", "in collectives", "in other ops", "", "peak memory", "most self time")
    out.extend(f'<th style="{th}">{html.escape(c)}</th>' for c in cols)
    out.append("</tr>")
    for r in p.ranks:
        s = p.summaries.get(r)
        if s is None:
            out.append(f'<tr><td style="{td}">{r}</td><td style="{td}" colspan="7">'
                       f'no profile: {html.escape(p.missing.get(r, "not profiled"))}</td></tr>')
            continue
        comm, comp = float(s.get("comm_us", 0.0)), float(s.get("compute_us", 0.0))
        share = comm / (comm + comp) if comm + comp > 0 else 0.0
        bar = (f'<span style="display:inline-block;width:80px;height:9px;background:#90caf9">'
               f'<span style="display:block;width:{round(share * 80)}px;height:9px;background:#e65100"></span></span>')
        top = "<br>".join(f"{html.escape(str(name))} {_ms(float(us))} ×{n}" for name, n, us in s.get("top", [])[:5])
        cells = (str(r), str(p.ops(r)), str(s.get("collectives", 0)), _ms(comm), _ms(comp), bar,
                 _bytes(int(s.get("peak_bytes", 0))), top)
        out.append("<tr>" + "".join(f'<td style="{td}">{c if i in (5, 7) else html.escape(c)}</td>'
                                    for i, c in enumerate(cells)) + "</tr>")
    out.append("</table>")
    out.append('<div style="margin-top:4px;color:#666">bar: time in collectives (orange) vs in other ops '
               "(blue); times are CPU self times, collectives as the backend ran them</div></div>")
    return "".join(out)
