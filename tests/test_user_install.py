"""A plain install serves every feature: pgnb from ``pip install .`` alone, in a venv of its own.

``make user-venv`` builds ``.venv-user``: the pinned CPU torch, then ``pip install .`` (no extras,
not editable), then only nbval and pytest to drive the checks; ``make test`` passes its python as
``PGNB_USER_PYTHON``. ``tests/test_notebooks.py`` replays every notebook with that python, so the
notebook suite is the plain-install check; this file checks that the venv really is a plain install
and runs one ``%%pg --trace`` cell in a real kernel started from it.

Without ``PGNB_USER_PYTHON`` these tests skip, or fail under ``PGNB_REQUIRE_USER_INSTALL=1``
(``make test`` sets it as root, as CI runs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from importlib.metadata import Distribution, distributions
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager
from kernel_util import Execution, Kernel
from packaging.requirements import Requirement

#: they need the user-install venv (made after make test's first stage) and run its python
pytestmark = pytest.mark.integration

USER_PYTHON_VAR = "PGNB_USER_PYTHON"
REQUIRE_VAR = "PGNB_REQUIRE_USER_INSTALL"
#: What drives the checks in the user venv (the Makefile installs these and nothing else).
DRIVERS = ("nbval", "pytest")
#: What `python -m venv` puts into every venv.
BOOTSTRAP = {"pip", "setuptools"}
ROOT = Path(__file__).resolve().parent.parent
#: what a lesson imports beside pgnb (lesson 15's training libraries), installed as a user would
LESSON_LIBS = tuple(line.strip() for line in (ROOT / "notebooks" / "requirements.txt").read_text().splitlines()
                    if line.strip() and not line.startswith("#"))


def user_python() -> str | None:
    """The user venv's python from PGNB_USER_PYTHON, or None when it is not given."""
    python = os.environ.get(USER_PYTHON_VAR)
    if not python:
        return None
    if not os.access(python, os.X_OK):
        raise FileNotFoundError(f"{USER_PYTHON_VAR}={python} is not an executable (run `make user-venv`)")
    return python


def user_env(**extra: str) -> dict[str, str]:
    """The environment for a process of the user venv: nothing points it at the repository's pgnb."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def user_py() -> str:
    python = user_python()
    if python is None:
        reason = f"no user-install venv: `make user-venv`, {USER_PYTHON_VAR}=.venv-user/bin/python (make test does)"
        if os.environ.get(REQUIRE_VAR) == "1":
            pytest.fail(f"{reason} ({REQUIRE_VAR}=1)")
        pytest.skip(reason)
    return python


# ---- the venv is a plain install -----------------------------------------------------------


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(python: str) -> dict[str, Distribution]:
    """Every distribution in the venv of ``python``, by normalized name (read from here, not run there)."""
    out = subprocess.run([python, "-c", "import json, sysconfig; p = sysconfig.get_paths(); "
                          "print(json.dumps(sorted({p['purelib'], p['platlib']})))"],
                         capture_output=True, text=True, check=True, env=user_env()).stdout
    return {_name(d.metadata["Name"]): d for d in distributions(path=json.loads(out))}


def _wanted(req: Requirement, extras: frozenset[str]) -> bool:
    # markers are evaluated for this interpreter: the same Python and platform as the user venv's
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""})


def closure(dists: dict[str, Distribution], roots: tuple[str, ...]) -> set[str]:
    """The names ``roots`` need, transitively, extras of requirements included (not the roots' own extras)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(_name(r), frozenset[str]()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = dists.get(name)
        for line in (dist.requires or []) if dist else []:
            req = Requirement(line)
            if _wanted(req, extras):
                todo.append((_name(req.name), frozenset(req.extras)))
    return {name for name, _ in seen}


def test_user_venv_is_a_plain_install(user_py):
    """pgnb (not editable), what it requires, nbval and pytest with theirs, and the libraries lesson 15 names
    with theirs: nothing else, no other package of pgnb's extras."""
    dists = installed(user_py)
    assert "pgnb" in dists, f"pgnb is not installed in {user_py}"
    direct = json.loads(dists["pgnb"].read_text("direct_url.json") or "{}")
    assert not direct.get("dir_info", {}).get("editable"), "pgnb must be installed from a wheel, not editable"
    needed = closure(dists, ("pgnb", *DRIVERS, *LESSON_LIBS))
    assert needed <= set(dists), f"requirements not installed: {sorted(needed - set(dists))}"
    stray = set(dists) - needed - BOOTSTRAP
    assert not stray, f"not part of a plain install: {sorted(stray)}"
    # the extras' packages (test, browser, dev) that a plain install does not bring are really absent
    extras_only = {_name(Requirement(line).name) for line in dists["pgnb"].requires or []
                   if not _wanted(Requirement(line), frozenset())} - needed
    assert {"hypothesis", "playwright", "jupyterlab", "nbclient", "pytest-timeout"} <= extras_only, extras_only
    assert not (extras_only - set(LESSON_LIBS)) & set(dists)
    assert {"numpy", "matplotlib"} <= closure(dists, ("pgnb",)), "pgnb must declare what its features import"


def test_notebooks_import_the_installed_pgnb(user_py):
    """From the notebooks' directory (nbval's kernel cwd), the user python imports its own pgnb, not ./pgnb."""
    out = subprocess.run([user_py, "-c", "import sys, pgnb; print(sys.prefix); print(pgnb.__file__)"],
                         cwd=ROOT / "notebooks", capture_output=True, text=True, check=True, env=user_env())
    prefix, where = out.stdout.splitlines()
    assert Path(prefix) == Path(user_py).parent.parent
    assert Path(where).is_relative_to(prefix) and not Path(where).is_relative_to(ROOT / "pgnb"), where


# ---- a traced cell in a real kernel of the user venv ----------------------------------------


class _PythonKernelSpecs(KernelSpecManager):
    """Every kernel name means ipykernel on one given python.

    (jupyter_client 8 dropped ``KernelManager.kernel_cmd``: setting it does nothing, and the
    kernel would run whatever the "python3" kernelspec found from this process names.)
    """

    def __init__(self, python: str) -> None:
        super().__init__()
        self.python = python

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(argv=[self.python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                          display_name=f"Python ({self.python})", language="python")


def kernel_manager(python: str) -> KernelManager:
    """A KernelManager whose kernel runs ``python`` (its ipykernel, its site-packages)."""
    return KernelManager(kernel_name="python3", kernel_spec_manager=_PythonKernelSpecs(python))


class UserKernel(Kernel):
    """kernel_util's Kernel, running ``python``'s ipykernel in ``cwd``."""

    def __init__(self, python: str, cwd: Path, env: dict[str, str]) -> None:
        self.km = kernel_manager(python)
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)


def _strings(ex: Execution) -> list[str]:
    """Every text the cell sent: streams, every string of every mime bundle, errors."""
    out: list[str] = []
    for o in ex.outputs:
        if o["type"] == "stream":
            out.append(o["text"])
        elif o["type"] == "error":
            out.extend([o["ename"], o["evalue"], *o["traceback"]])
        else:
            out.extend(v for k, v in o["data"].items() if isinstance(v, str) and not k.startswith("image/"))
    return out


def _stdout(ex: Execution) -> str:
    return "".join(o["text"] for o in ex.outputs if o.get("name") == "stdout")


def _clean(ex: Execution, code: str) -> None:
    assert ex.status == "ok", f"{code!r}: {ex.error}\n{ex.text()}"
    stderr = [o["text"] for o in ex.outputs if o.get("name") == "stderr"]
    assert not stderr, f"{code!r} wrote to stderr: {stderr}"
    for text in _strings(ex):
        assert "Traceback" not in text and "Error" not in text, f"{code!r}: {text}"


@pytest.mark.kernel
@pytest.mark.integration
def test_traced_cell_in_a_user_kernel(user_py, tmp_path):
    """%%pg --trace in a kernel of the plain install: summary and timeline, nothing on stderr, no traceback."""
    cwd = tmp_path / "cwd"  # not the repository root, so ./pgnb cannot shadow the installed pgnb
    cwd.mkdir()
    kernel = UserKernel(user_py, cwd, user_env(IPYTHONDIR=str(tmp_path / "ipython")))
    venv = Path(user_py).parent.parent

    def run(code: str) -> Execution:
        ex = kernel.execute(code)
        _clean(ex, code)
        return ex

    try:
        where = _stdout(run("import sys, pgnb\nprint(sys.prefix)\nprint(pgnb.__file__)"))
        prefix, pgnb_file = where.splitlines()
        assert Path(prefix) == venv and Path(pgnb_file).is_relative_to(venv), where
        run("%load_ext pgnb")
        run("%pg_init --backend gloo --world 2")
        ranks = _stdout(run("%%pg\nimport sys\nprint(sys.prefix)"))
        assert ranks.count(str(venv)) == 2, ranks  # the ranks run the user venv's python too
        traced = run("%%pg --trace\nimport torch\nimport torch.distributed as dist\ndist.all_reduce(torch.ones(2))")
        pictures = [o for o in traced.outputs if o["type"] == "display_data" and "image/png" in o["data"]]
        assert len(pictures) == 1, traced.text()  # the timeline
        text = traced.text()
        # (how a list of ranks is written is the trace's business, not this test's)
        assert re.search(r"trace of ranks .*: 1 call each, the same on every rank", text), text
        assert "all_reduce(float32[2], op=SUM)" in text, text
        assert "<pgnb timeline: ranks " in text, text
        run("%pg_shutdown")
    finally:
        kernel.shutdown()



# ---- pgnb mcp: without the extra one line, with `pip install "pgnb[mcp]"` the stdio server ------------


def test_mcp_without_the_extra_says_what_to_install(user_py):
    """The plain install has no MCP SDK: ``pgnb mcp`` says in one line what to install, at once."""
    t0 = time.monotonic()
    out = subprocess.run([user_py, "-m", "pgnb", "mcp"], capture_output=True, text=True, env=user_env(),
                         stdin=subprocess.DEVNULL, timeout=60)
    assert time.monotonic() - t0 < 10
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr == 'pgnb mcp needs the MCP SDK: pip install "pgnb[mcp]"\n', out.stderr


@pytest.fixture(scope="module")
def mcp_py(user_py, tmp_path_factory):
    """A venv where ``pip install "<pgnb's wheel>[mcp]"`` ran: over the user venv (a .pth file names its
    site-packages, so torch and pgnb's other requirements are not installed twice), so pip brings only
    what the extra adds, into the new venv (the user venv stays a plain install)."""
    wheels = sorted((ROOT / "dist").glob("pgnb-*.whl"))
    assert wheels, "no pgnb wheel in dist/ (make user-venv builds it)"
    venv = tmp_path_factory.mktemp("mcp") / "venv"
    subprocess.run([user_py, "-m", "venv", "--without-pip", str(venv)], check=True, env=user_env())
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=user_env()).stdout.strip()
    under = subprocess.run([user_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True, env=user_env()).stdout.strip()
    Path(site, "user_venv.pth").write_text(under + "\n")
    # the user venv's pip installs into the new venv (--python): no pip of its own to bootstrap there
    subprocess.run([user_py, "-m", "pip", "--python", python, "install", "--disable-pip-version-check", "-q",
                    "--no-compile", f"{wheels[-1]}[mcp]"],
                   check=True, env=user_env(), timeout=600)
    return python


@pytest.mark.kernel
def test_mcp_extra_runs_the_stdio_server(mcp_py, tmp_path):
    """``pip install "pgnb[mcp]"``: pgnb mcp serves over stdio (the SDK's client: a world of 2, an all_reduce),
    writes nothing but protocol to stdout, and leaves nothing running once the client has closed."""
    import anyio
    import psutil
    from mcp import Client, StdioServerParameters

    from pgnb.procs.processes import process_running

    stdout = tmp_path / "stdout"
    cmd = f"exec {mcp_py} -m pgnb mcp | tee {stdout}"  # what the client reads, also kept to be checked
    params = StdioServerParameters(command="sh", args=["-c", cmd],
                                   env=user_env(IPYTHONDIR=str(tmp_path / "ipython")), cwd=str(tmp_path))
    procs: list[psutil.Process] = []

    async def go() -> None:
        async with Client(params) as client:
            assert "pg_run" in {t.name for t in (await client.list_tools()).tools}
            init = await client.call_tool("pg_init", {"world": 2})
            assert not init.is_error, init.content
            (server,) = [p for p in psutil.Process().children(recursive=True) if p.cmdline()[-2:] == ["pgnb", "mcp"]]
            assert server.cmdline()[0] == mcp_py, server.cmdline()
            procs.extend([server, *server.children(recursive=True)])
            run = await client.call_tool("pg_run", {"code": "t = torch.ones(1)\ndist.all_reduce(t)\nprint(t)"})
            assert [r["stdout"] for r in run.structured_content["ranks"]] == ["tensor([2.])\n"] * 2, run.content

    anyio.run(go)
    lines = stdout.read_text().splitlines()
    assert lines, "the server wrote nothing"
    for line in lines:
        assert json.loads(line)["jsonrpc"] == "2.0", line
    def alive() -> list[psutil.Process]:
        return [p for p in procs if p.is_running() and process_running(p.pid)]  # is_running: not a reused pid

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(procs) >= 5 and not alive(), alive()
