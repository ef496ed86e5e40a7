"""Fixtures for real-browser tests: JupyterLab + headless Chromium through Playwright.

What they give a test:

* ``lab_server``: ``jupyter lab`` on 127.0.0.1, a free port and a random token,
  every Jupyter/IPython directory (config, data, runtime, IPYTHONDIR,
  workspaces, user settings) in a temp dir, no news or update checks.
  Torn down through Jupyter's REST API (DELETE each kernel, POST
  /api/shutdown); only if the server will not go does it ``killpg`` the
  server's own process group (started with ``start_new_session``).
* ``lab_page``: a Playwright persistent context on Debian's
  ``/usr/bin/chromium`` (never ``playwright install``). Every request that is
  not to loopback is aborted and reported; the test fails if there was one.
* ``open_notebook``: writes a *copy* of a notebook into the server's temp
  root, opens it (in JupyterLab, or with ``ui="notebook"`` in Notebook 7),
  waits until its kernel is really ready, and returns a ``LabNotebook``
  whose ``run(i)`` runs cell ``i`` with Ctrl+Enter and ``save()`` saves it.
* ``pgnb_leftovers``: processes pgnb started for this run and left alive.
* ``controller_errors(server)``: ``[IPController] ERROR`` lines in the server's
  log and in the ipyparallel controller logs of the server's IPython dir
  (where ipyparallel writes a controller's output; the server prints it too
  when its ipyparallel extension sees a controller stop).

Why each step is the way it is: /work/shared/reference/browser-widget-test/
README.md ("Pitfalls found"), numbers quoted below.

Environment knobs:
  JUPYTER_PYTHON        Python with jupyterlab + ipywidgets (default: this one)
  CHROMIUM              browser binary (default /usr/bin/chromium)
  ARTIFACTS_DIR         screenshots, server log, timings (default: pytest tmp dir)
  PGNB_REQUIRE_BROWSER  1: a missing browser/playwright/jupyterlab fails instead of skipping (CI)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn
from urllib.parse import quote, urlsplit

import pytest

from pgnb.procs.processes import OWNER_ENV, process_running

REPO_ROOT = Path(__file__).resolve().parents[2]
JUPYTER_PYTHON = os.environ.get("JUPYTER_PYTHON", sys.executable)
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",  # running as root (pitfall 1)
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # never --user-data-dir here: Playwright refuses it (pitfall 2)
]
SERVER_START_S = 60
UI_TIMEOUT_MS = 60_000
#: Every process started under the server inherits this; it tells our own
#: pgnb processes from those of anyone else on the machine.
RUN_MARKER_VAR = "PGNB_BROWSER_TEST_RUN"
#: pgnb puts this variable in the environment of every process it starts.
OWNER_VAR = OWNER_ENV
#: The extension under test; ``standin_pgnb`` (in this folder) checks the harness without pgnb.
EXTENSION = os.environ.get("PGNB_BROWSER_EXTENSION", "pgnb")

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}

# JupyterLab (and Notebook 7) user settings (pitfall 10; windowing off so every cell is in the DOM).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

# The toolbar indicator says "idle" before any kernel exists, while the status
# bar still says "No Kernel | Initializing"; a Ctrl+Enter sent then is dropped
# (pitfall 5). Ready = both say idle.
KERNEL_READY_JS = """() => {
  const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
  const bar = [...document.querySelectorAll('.jp-StatusBar-Item')]
      .some(e => /[|] Idle$/.test(e.innerText.trim()));
  return !!ind && ind.dataset.status === 'idle' && bar;
}"""

# Notebook 7 has no status bar: ready = the toolbar's indicator says idle and the kernel's name is shown.
NOTEBOOK7_READY_JS = """() => {
  const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
  const name = document.querySelector('.jp-KernelName, .jp-Toolbar-kernelName');
  return !!ind && ind.dataset.status === 'idle' && !!name && /Python/.test(name.innerText);
}"""

DONE_PROMPT = re.compile(r"^\[\d+\]:$")
CONTROLLER_ERROR = re.compile(r"\[IPController\] ERROR.*")
ERROR_MIME_TYPES = ("application/vnd.jupyter.stderr",)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives JupyterLab in headless Chromium (chromium, playwright, jupyterlab)"
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Let fixtures see whether the test failed (to save a failure screenshot).
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("PGNB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (PGNB_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


def _require_browser() -> None:
    """Skip (or fail, under PGNB_REQUIRE_BROWSER=1) before starting anything."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright; never `playwright install`)")
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        _unavailable(f"no browser at {CHROMIUM} (apt-get install -y --no-install-recommends chromium)")


def notebook7_available() -> bool:
    """Notebook 7 is installed where the server runs (it then serves /notebooks/ beside /lab)."""
    probe = subprocess.run(
        [JUPYTER_PYTHON, "-c", "import notebook, sys; sys.exit(int(notebook.__version__.split('.')[0]) < 7)"],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_loopback_url(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "about"):
        return True
    host = (parts.hostname or "").lower()
    return host == "localhost" or host == "::1" or host.startswith("127.")


# ---------------------------------------------------------------- processes


def pgnb_processes(marker: str) -> list[dict[str, Any]]:
    """Live processes that carry ``PGNB_OWNER`` and this run's marker.

    Read from ``/proc/*/environ`` (the environment a process was started
    with). Other people's pgnb processes lack our marker and are ignored;
    nothing here ever signals a process.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if not process_running(int(entry.name)):
            continue  # a zombie holds no resources; its parent reaps it
        env = dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)
        if OWNER_VAR.encode() not in env or env.get(RUN_MARKER_VAR.encode()) != marker.encode():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        found.append(
            {"pid": int(entry.name), "owner": env[OWNER_VAR.encode()].decode(errors="replace"), "cmd": cmd[:200]}
        )
    return found


def wait_no_pgnb_processes(marker: str, timeout_s: float) -> list[dict[str, Any]]:
    """Wait up to ``timeout_s`` for our pgnb processes to exit; return those still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = pgnb_processes(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# ---------------------------------------------------------------- server


@dataclass
class LabServer:
    base: str
    token: str
    root: Path
    home: Path
    proc: subprocess.Popen[bytes]
    marker: str
    startup_s: float
    log_path: Path | None = None

    def api(self, path: str, method: str = "GET", timeout: float = 10) -> Any:
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            return json.loads(body) if body else None

    def kernel_of(self, path: str) -> str | None:
        for session in self.api("/api/sessions"):
            if session.get("path") == path and session.get("kernel"):
                return str(session["kernel"]["id"])
        return None

    def delete_kernel(self, kernel_id: str) -> None:
        # Graceful: shutdown_request first, so the kernel's atexit hooks run.
        self.api(f"/api/kernels/{kernel_id}", method="DELETE", timeout=30)

    def put_setting(self, plugin: str, values: dict[str, Any]) -> None:
        """Change a JupyterLab user setting (the page picks it up when it loads next)."""
        body = json.dumps({"raw": json.dumps(values)}).encode()
        req = urllib.request.Request(
            f"{self.base}/lab/api/settings/{quote(plugin)}", data=body, method="PUT",
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    def kernel_connected_idle(self, path: str) -> bool:
        """The notebook's kernel is idle and a frontend holds a websocket to it."""
        for session in self.api("/api/sessions"):
            kernel = session.get("kernel") or {}
            if session.get("path") == path and kernel.get("id"):
                k = self.api(f"/api/kernels/{kernel['id']}")
                return bool(k.get("execution_state") == "idle" and k.get("connections", 0) >= 1)
        return False


def controller_errors(server: LabServer) -> list[str]:
    """``[IPController] ERROR`` lines the server printed or a controller logged (ipyparallel's log files)."""
    found = []
    logs = sorted((server.home / "ipython").glob("profile_*/log/*.log"))
    for path in [p for p in [server.log_path] if p is not None] + logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:  # a controller's log is removed when the controller stops
            continue
        found += [f"{path.name}: {m.group(0)[:300]}" for m in CONTROLLER_ERROR.finditer(text)]
    return found


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = Path(os.environ.get("ARTIFACTS_DIR") or tmp_path_factory.mktemp("artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


#: Tries at starting the Jupyter server, each on a port picked free a moment before
PORT_TRIES = 3


def _start_lab(options: list[str], env: dict[str, str], port: int, token: str, root: Path, home: Path,
               marker: str, log_path: Path) -> tuple[LabServer, IO[bytes]]:
    log = open(log_path, "wb")  # noqa: SIM115 - closed by the caller
    cmd = [JUPYTER_PYTHON, "-m", "jupyterlab", f"--ServerApp.port={port}", *options]
    # Own session: on a last-resort teardown we signal exactly our own group.
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return LabServer(f"http://127.0.0.1:{port}", token, root, home, proc, marker, 0.0, log_path), log


def _wait_lab_up(server: LabServer, log: IO[bytes], t0: float, last_try: bool) -> bool:
    """Whether the server answers; False when it exited because its port was taken (and this is not the
    last try); fails the test on any other exit and on a server not up in time."""
    assert server.log_path is not None
    while True:
        if server.proc.poll() is not None:
            log.close()
            text = server.log_path.read_text(errors="replace")
            if ("is already in use" in text or "is not available" in text) and not last_try:
                return False
            pytest.fail(f"jupyter lab exited rc={server.proc.returncode}:\n{text[-3000:]}")
        try:
            server.api("/api/status", timeout=2)
            return True
        except (urllib.error.URLError, OSError):
            if time.monotonic() - t0 > SERVER_START_S:
                _stop_server(server)
                log.close()
                pytest.fail(f"jupyter lab not up after {SERVER_START_S}s; log: {server.log_path}")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    _require_browser()
    probe = subprocess.run(
        [JUPYTER_PYTHON, "-c", "import jupyterlab, ipywidgets, jupyterlab_widgets"],
        capture_output=True,
        timeout=60,
    )
    if probe.returncode:
        _unavailable(f"{JUPYTER_PYTHON} lacks jupyterlab/ipywidgets/jupyterlab_widgets")

    home = tmp_path_factory.mktemp("jlab")
    dirs = {d: home / d for d in ("root", "config", "data", "runtime", "ipython", "settings", "workspaces", "xdg")}
    for d in dirs.values():
        d.mkdir()
    for rel, content in LAB_SETTINGS.items():
        f = dirs["settings"] / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(content))

    token, marker = secrets.token_hex(16), secrets.token_hex(8)
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    if EXTENSION == "standin_pgnb":
        paths.insert(0, str(Path(__file__).parent))
    pythonpath = os.pathsep.join(p for p in paths if p)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        IPYTHONDIR=str(dirs["ipython"]),  # ipyparallel profiles land here too
        XDG_CACHE_HOME=str(dirs["xdg"]),
        PYTHONPATH=pythonpath,  # the kernel imports this checkout's pgnb
        **{RUN_MARKER_VAR: marker},
    )
    options = [
        "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={dirs['root']}",
        "--ServerApp.terminals_enabled=False",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        f"--LabApp.user_settings_dir={dirs['settings']}",
        f"--LabApp.workspaces_dir={dirs['workspaces']}",
    ]  # fmt: skip
    if notebook7_available():  # Notebook 7 is another app of the same server: the same settings
        options += [f"--JupyterNotebookApp.user_settings_dir={dirs['settings']}",
                    f"--JupyterNotebookApp.workspaces_dir={dirs['workspaces']}"]
    log_path = artifacts / "jupyter_server.log"
    t0 = time.monotonic()
    for attempt in range(PORT_TRIES):
        # The port is free when picked, but another process may take it before the server binds it.
        server, log = _start_lab(options, env, _free_port(), token, dirs["root"], home, marker, log_path)
        if _wait_lab_up(server, log, t0, last_try=attempt == PORT_TRIES - 1):
            break
    server.startup_s = time.monotonic() - t0
    try:
        yield server
    finally:
        _stop_server(server)
        log.close()
    left = wait_no_pgnb_processes(marker, timeout_s=15)
    assert not left, f"pgnb processes outlived the Jupyter server (not killed by this test): {left}"


def _stop_server(server: LabServer) -> None:
    """REST first (kernels shut down gracefully, then the server); killpg last."""
    proc = server.proc
    try:
        for k in server.api("/api/kernels"):
            server.delete_kernel(k["id"])
        server.api("/api/shutdown", method="POST")
    except (urllib.error.URLError, OSError, ValueError):
        pass
    try:
        proc.wait(timeout=20)
        return
    except subprocess.TimeoutExpired:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------- browser


@dataclass
class Traffic:
    """What the page tried to reach, and the kernel messages that tests wait on."""

    blocked: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    websockets: list[str] = field(default_factory=list)
    #: msg_ids of widget ``click`` comm messages the page sent to a kernel
    clicks_sent: list[str] = field(default_factory=list)
    #: parent msg_ids whose handling the kernel reported finished (status: idle)
    idle_after: set[str] = field(default_factory=set)

    def on_sent(self, payload: str | bytes) -> None:
        msg = decode_kernel_frame(payload)
        if msg and msg["header"].get("msg_type") == "comm_msg":
            data = msg["content"].get("data") or {}
            if (data.get("content") or {}).get("event") == "click":
                self.clicks_sent.append(msg["header"]["msg_id"])

    def on_received(self, payload: str | bytes) -> None:
        # cheap pre-filter: most frames are widget state and output
        if "execution_state" not in (payload if isinstance(payload, str) else payload.decode("latin-1")):
            return
        msg = decode_kernel_frame(payload)
        if msg and msg["content"].get("execution_state") == "idle":
            parent = msg.get("parent_header") or {}
            if parent.get("msg_id"):
                self.idle_after.add(parent["msg_id"])


def decode_kernel_frame(payload: str | bytes) -> dict[str, Any] | None:
    """A Jupyter kernel websocket frame as a dict (JSON, or the v1 binary protocol)."""
    try:
        if isinstance(payload, str):
            msg = json.loads(payload)
            return msg if isinstance(msg, dict) and "header" in msg else None
        # v1.kernel.websocket.jupyter.org: n, offsets[n] (uint64 LE), then
        # channel, header, parent_header, metadata, content, buffers...
        n = int.from_bytes(payload[:8], "little")
        offs = [int.from_bytes(payload[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(n)]
        parts = [payload[offs[i] : offs[i + 1]] for i in range(min(n - 1, 5))]
        if len(parts) < 5:
            return None
        keys = ("channel", "header", "parent_header", "metadata", "content")
        msg = {k: (p.decode() if k == "channel" else json.loads(p)) for k, p in zip(keys, parts, strict=True)}
        return msg
    except (ValueError, UnicodeDecodeError, IndexError):
        return None


@pytest.fixture
def traffic() -> Traffic:
    """What ``lab_page`` tried to reach; the test fails if it left loopback."""
    return Traffic()


@pytest.fixture
def lab_page(request: pytest.FixtureRequest, lab_server: LabServer, artifacts: Path, traffic: Traffic) -> Iterator[Any]:
    """A Chromium page, loopback only; ``traffic`` records what it tried to reach."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="pgnb-chromium-"))
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile / "user-data"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            # crashpad writes under $HOME/.config otherwise (pitfall 4)
            env={**os.environ, "HOME": str(profile), "XDG_CONFIG_HOME": str(profile / "config")},
        )
        ctx.set_default_timeout(UI_TIMEOUT_MS)

        def loopback_only(route: Any) -> None:
            if is_loopback_url(route.request.url):
                route.continue_()
            else:
                traffic.blocked.append(route.request.url)
                route.abort()

        def on_websocket(ws: Any) -> None:
            traffic.websockets.append(ws.url)
            ws.on("framesent", traffic.on_sent)
            ws.on("framereceived", traffic.on_received)

        ctx.route("**/*", loopback_only)
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        page.on("pageerror", lambda e: traffic.page_errors.append(str(e)))
        page.on("console", lambda m: traffic.console_errors.append(m.text) if m.type == "error" else None)
        page.on("websocket", on_websocket)
        try:
            yield page
        finally:
            rep = getattr(request.node, "rep_call", None)
            if rep is not None and rep.failed:
                _save_failure_state(page, artifacts, request.node.name)
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)
    if traffic.blocked or traffic.console_errors:
        print("blocked non-loopback requests:", traffic.blocked, "console errors:", traffic.console_errors)
    offsite = [u for u in traffic.websockets if not is_loopback_url(u)]
    assert not traffic.blocked and not offsite, f"the page reached beyond loopback: {traffic.blocked + offsite}"


def _save_failure_state(page: Any, artifacts: Path, name: str) -> None:
    safe = re.sub(r"[^\w.-]+", "_", name)
    try:
        page.screenshot(path=str(artifacts / f"failure_{safe}.png"), full_page=True)
        outputs = page.locator(".jp-Notebook .jp-Cell").all_inner_texts()
        (artifacts / f"failure_{safe}_cells.txt").write_text("\n\n----\n\n".join(outputs))
    except Exception as exc:  # the page may be gone; the test's own error matters more
        print(f"could not save failure state: {exc!r}")


# ---------------------------------------------------------------- notebooks


@dataclass
class LabNotebook:
    """A notebook open in Lab, driven from the UI."""

    page: Any
    server: LabServer
    path: str
    traffic: Traffic
    timings: dict[str, float] = field(default_factory=dict)
    #: "lab" (JupyterLab) or "notebook" (Notebook 7)
    ui: str = "lab"

    @property
    def cells(self) -> Any:
        return self.page.locator(".jp-Notebook .jp-Cell")

    def cell(self, index: int) -> Any:
        return self.cells.nth(index)

    def output(self, index: int) -> Any:
        return self.cell(index).locator(".jp-OutputArea").first

    def prompt(self, index: int) -> Any:
        return self.cell(index).locator(".jp-InputArea-prompt")

    def wait_kernel_ready(self, timeout_ms: int = UI_TIMEOUT_MS) -> None:
        self.page.wait_for_function(KERNEL_READY_JS if self.ui == "lab" else NOTEBOOK7_READY_JS, timeout=timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        while not self.server.kernel_connected_idle(self.path):
            if time.monotonic() > deadline:
                pytest.fail(f"the kernel of {self.path} never became idle with a frontend connected")
            self.page.wait_for_timeout(100)

    def code_cells(self) -> list[int]:
        """Indexes of the code cells (every cell is in the DOM: windowing is off)."""
        kinds = self.cells.evaluate_all("cells => cells.map(c => c.classList.contains('jp-CodeCell'))")
        return [i for i, code in enumerate(kinds) if code]

    def save(self, timeout_ms: int = UI_TIMEOUT_MS) -> dict[str, Any]:
        """Save with Ctrl+S and return the notebook as the server wrote it."""
        path = self.server.root / self.path
        before = path.stat().st_mtime_ns
        self.cell(0).click()
        self.page.keyboard.press("Control+s")
        deadline = time.monotonic() + timeout_ms / 1000
        while path.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                pytest.fail(f"{self.path} was not saved")
            self.page.wait_for_timeout(100)
        self.page.wait_for_timeout(500)  # the write may still be going on
        return dict(json.loads(path.read_text()))

    def run(self, index: int, *, wait: bool = True, timeout_ms: int = UI_TIMEOUT_MS) -> None:
        """Run cell ``index`` with Ctrl+Enter (runs in place; Shift+Enter adds a cell, pitfall 6).

        A keystroke can be dropped (pitfall 5), so it checks that the prompt
        changed (``[ ]:``/``[n]:`` -> ``[*]:``/``[n+1]:``) and retries.
        """
        from playwright.sync_api import expect

        prompt = self.prompt(index)
        before = prompt.inner_text().strip()
        for _attempt in range(4):
            self.cell(index).locator(".jp-InputArea-editor").click()
            self.page.keyboard.press("Control+Enter")
            try:
                expect(prompt).not_to_have_text(before, timeout=5_000)
                break
            except AssertionError:
                continue
        else:
            pytest.fail(f"cell {index} never started executing (prompt stayed {before!r})")
        if wait:
            self.wait_done(index, timeout_ms=timeout_ms)

    def wait_done(self, index: int, timeout_ms: int = UI_TIMEOUT_MS) -> None:
        from playwright.sync_api import expect

        # expect() has its own 5 s default; always pass timeout= (pitfall 7)
        expect(self.prompt(index)).to_have_text(DONE_PROMPT, timeout=timeout_ms)

    def click_widget(self, locator: Any, timeout_ms: int = UI_TIMEOUT_MS) -> float:
        """Click a widget button and wait until the kernel has handled the click.

        "Handled" = the kernel's ``status: idle`` whose parent is the click's
        ``comm_msg`` came back, so whatever the handler changed has been sent.
        Returns the seconds that took.
        """
        traffic = self.traffic
        n = len(traffic.clicks_sent)
        t0 = time.monotonic()
        locator.click()
        deadline = t0 + timeout_ms / 1000
        while len(traffic.clicks_sent) == n:
            if time.monotonic() > deadline:
                pytest.fail("the click never reached the kernel (no comm_msg 'click' on the websocket)")
            self.page.wait_for_timeout(20)
        msg_id = traffic.clicks_sent[n]
        while msg_id not in traffic.idle_after:
            if time.monotonic() > deadline:
                pytest.fail(f"the kernel did not finish handling the click within {timeout_ms} ms")
            self.page.wait_for_timeout(20)
        return time.monotonic() - t0

    def error_outputs(self, index: int) -> list[str]:
        """Text of stderr/traceback outputs of cell ``index`` (a UsageError shows on stderr)."""
        sel = ", ".join(f".jp-OutputArea-output[data-mime-type='{m}']" for m in ERROR_MIME_TYPES)
        return [t.strip() for t in self.cell(index).locator(sel).all_inner_texts()]


def make_notebook(sources: list[str]) -> dict[str, Any]:
    cells: list[dict[str, Any]] = [
        {
            "cell_type": "code",
            "id": f"cell-{i}",
            "execution_count": None,
            "metadata": {},
            "outputs": [],
            "source": src.splitlines(keepends=True),
        }
        for i, src in enumerate(sources)
    ]
    # a kernelspec avoids the "Select Kernel" dialog (pitfall 14)
    metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def open_notebook(
    lab_server: LabServer, lab_page: Any, traffic: Traffic
) -> Iterator[Callable[[str, list[str]], LabNotebook]]:
    """``open_notebook(name, cell_sources)``: a fresh copy, opened, kernel ready.

    On teardown each notebook's kernel is deleted through the REST API.
    """
    opened: list[LabNotebook] = []

    def open_(name: str, sources: list[str] | Path, ui: str = "lab") -> LabNotebook:
        """``sources``: the cells of a new notebook, or a notebook file to copy."""
        if (lab_server.root / name).exists():
            raise ValueError(f"{name} already exists in this server's root; pick a fresh name")
        if isinstance(sources, Path):
            shutil.copyfile(sources, lab_server.root / name)
        else:
            (lab_server.root / name).write_text(json.dumps(make_notebook(sources), indent=1))
        if ui == "lab":
            url = f"{lab_server.base}/lab/tree/{quote(name)}?token={lab_server.token}&reset"
        else:
            url = f"{lab_server.base}/notebooks/{quote(name)}?token={lab_server.token}"
        t0 = time.monotonic()
        lab_page.goto(url)
        nb = LabNotebook(lab_page, lab_server, name, traffic, ui=ui)
        opened.append(nb)
        nb.timings["page_loaded"] = time.monotonic() - t0
        # a code cell's editor (a rendered markdown cell's editor is hidden)
        lab_page.wait_for_selector(".jp-Notebook .jp-CodeCell .jp-InputArea-editor .cm-content")
        nb.timings["editor_up"] = time.monotonic() - t0
        nb.wait_kernel_ready()
        nb.timings["kernel_ready"] = time.monotonic() - t0
        return nb

    yield open_
    for nb in opened:
        try:
            kid = lab_server.kernel_of(nb.path)
            if kid:
                lab_server.delete_kernel(kid)
        except (urllib.error.URLError, OSError) as exc:
            print(f"could not delete the kernel of {nb.path}: {exc!r}")


@pytest.fixture
def pgnb_leftovers(lab_server: LabServer) -> Callable[[float], list[dict[str, Any]]]:
    """``pgnb_leftovers(timeout_s)``: this run's pgnb processes still alive after waiting."""

    def leftovers(timeout_s: float = 0.0) -> list[dict[str, Any]]:
        return wait_no_pgnb_processes(lab_server.marker, timeout_s)

    return leftovers


@pytest.fixture
def pgnb_process_list(lab_server: LabServer) -> Callable[[], list[dict[str, Any]]]:
    """This run's live pgnb processes, right now."""
    return lambda: pgnb_processes(lab_server.marker)
