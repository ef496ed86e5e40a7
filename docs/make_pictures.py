"""Make the docs' pictures of seeing collectives: a trace timeline and a ``pgnb.show`` grid.

    IPYTHONDIR=$(mktemp -d) python docs/make_pictures.py

Starts a 4-rank gloo world, runs the straggler cell of notebook 07 with
tracing and saves its timeline (``docs/trace_timeline.png``), then shows a
tensor whose ranks disagree on the shape and screenshots the HTML view in
headless Chromium (``docs/show_grid.png``; needs playwright and
``/usr/bin/chromium``, or the ``CHROMIUM`` variable).
"""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

STRAGGLER = """\
import time

t = torch.ones(1000)
for step in range(3):
    if rank == 2 and step == 1:
        time.sleep(1)  # rank 2 is late for the second all_reduce
    dist.all_reduce(t)
"""

VALUES = """\
t = torch.arange(6.) * (rank + 1)
if rank == 3:
    t = t[:4]  # one rank with a different shape: the view marks it
"""


def screenshot(html: str, path: str) -> None:
    from playwright.sync_api import sync_playwright

    page_html = f"<html><body style='margin:12px;background:white'>{html}</body></html>"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(device_scale_factor=2)
            page.set_content(page_html)
            page.locator(".pgnb-show").screenshot(path=path)
        finally:
            browser.close()


def main() -> int:
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="pgnb-pictures-"))
    import pgnb
    from pgnb.core.show import gather
    from pgnb.core.timeline import timeline
    from pgnb.notebook.show import to_html

    with pgnb.Sandbox(backend="gloo", world=4) as sb:
        res = sb.execute(STRAGGLER, trace=True)
        if res.error() is not None:
            raise res.error()
        print(res.trace.summary())
        timeline(res.trace).save(os.path.join(HERE, "trace_timeline.png"))
        err = sb.execute(VALUES).error()
        if err is not None:
            raise err
        view = gather("t", world=sb)
        print(view.text())
        screenshot(to_html(view), os.path.join(HERE, "show_grid.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
