"""Make the docs' pictures: a trace timeline, a ``pgnb.show`` grid, the pipeline bubble.

    IPYTHONDIR=$(mktemp -d) python docs/make_pictures.py [trace_timeline show_grid pipeline_bubble]

(all three when no name is given). Starts a 4-rank gloo world, runs the
straggler cell of notebook 07 with tracing and saves its timeline
(``docs/trace_timeline.png``), then shows a tensor whose ranks disagree on the
shape and screenshots the HTML view in headless Chromium
(``docs/show_grid.png``; needs playwright and ``/usr/bin/chromium``, or the
``CHROMIUM`` variable). Then starts a 2-rank world, profiles lesson 14's GPipe
step a few times as the lesson does, and draws the quickest (the least disturbed
by other work on the machine) with the lesson's own ``bubble_picture``
(``docs/pipeline_bubble.png``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LESSON_14 = os.path.join(HERE, os.pardir, "notebooks", "14_pipeline_parallel.ipynb")
PICTURES = ("trace_timeline", "show_grid", "pipeline_bubble")
#: Profiled GPipe steps to choose the picture from: the quickest, on a machine shared with other work.
BUBBLE_STEPS = 5
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

#: Lesson 14's model, split into two stages, and one GPipe step (its warm-up: the shapes are agreed on).
PIPELINE = """\
import torch
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

WIDTH, LAYERS, BATCH, MICRO_BATCHES = 1024, 4, 512, 4
torch.manual_seed(0)
layers = []
for _ in range(LAYERS):
    layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers)
half = len(model) // 2
stage = PipelineStage(model[:half] if rank == 0 else model[half:], rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=MICRO_BATCHES)
batch = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    out = schedule.step(batch) if rank == 0 else schedule.step()
"""

STEP = """\
with torch.no_grad():
    out = schedule.step(batch) if rank == 0 else schedule.step()
"""


def lesson_function(path: str, name: str) -> object:
    """The function ``name`` as lesson ``path`` defines it in a code cell: the picture is the lesson's own."""
    with open(path) as f:
        cells = json.load(f)["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and f"def {name}(" in source:
            namespace: dict[str, object] = {}
            exec(compile(source, path, "exec"), namespace)  # noqa: S102 -- this repository's own lesson
            return namespace[name]
    raise LookupError(f"{path} defines no {name}()")


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


def main(names: list[str]) -> int:
    wanted = set(names or PICTURES)
    if wanted - set(PICTURES):
        print(f"unknown picture(s) {sorted(wanted - set(PICTURES))}; choose from {', '.join(PICTURES)}")
        return 2
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="pgnb-pictures-"))
    import pgnb
    from pgnb.core.show import gather
    from pgnb.notebook.show import to_html
    from pgnb.notebook.trace import timeline

    if wanted & {"trace_timeline", "show_grid"}:
        with pgnb.Sandbox(backend="gloo", world=4) as sb:
            if "trace_timeline" in wanted:
                res = sb.execute(STRAGGLER, trace=True)
                if res.error() is not None:
                    raise res.error()
                print(res.trace.summary())
                timeline(res.trace).save(os.path.join(HERE, "trace_timeline.png"))
            if "show_grid" in wanted:
                err = sb.execute(VALUES).error()
                if err is not None:
                    raise err
                view = gather("t", world=sb)
                print(view.text())
                screenshot(to_html(view), os.path.join(HERE, "show_grid.png"))
    if "pipeline_bubble" in wanted:
        bubble_picture = lesson_function(LESSON_14, "bubble_picture")
        with pgnb.Sandbox(backend="gloo", world=2) as sb, tempfile.TemporaryDirectory() as tmp:
            err = sb.execute(PIPELINE).error()
            if err is not None:
                raise err
            best = None  # (seconds, picture): the quickest of a few steps, the least disturbed by other work
            for i in range(BUBBLE_STEPS):
                res = sb.execute(STEP, profile=os.path.join(tmp, f"pipeline-{i}.json"))
                if res.error() is not None:
                    raise res.error()
                picture, work = bubble_picture(res.profile.path)  # type: ignore[operator]
                seconds = (max(e for _, e in work.values()) - min(s for s, _ in work.values())) / 1e6
                print(f"step {i}: {seconds * 1e3:.0f} ms")
                if best is None or seconds < best[0]:
                    best = (seconds, picture)
            assert best is not None
            print(res.profile.text())
            with open(os.path.join(HERE, "pipeline_bubble.png"), "wb") as f:
                f.write(best[1].data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
