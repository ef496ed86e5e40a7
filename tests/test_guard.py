"""Every magic ends in success or one line (pgnb/notebook/guard.py), without engines: failures are injected."""

from __future__ import annotations

import sys
from unittest import mock

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import pgnb
from pgnb.errors import Interrupted
from pgnb.notebook.current import current, set_current


@pytest.fixture
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    from pgnb.notebook.guard import ErrorLog

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pgnb")
    shell.magics_manager.registry["PgMagics"].errors = ErrorLog()  # this test's errors only
    saved = current()
    set_current(None)
    yield shell
    set_current(saved)


def _line_magic(ip, name, line):
    with capture_output() as cap:
        try:
            ip.run_line_magic(name, line)
        except UsageError as e:
            return str(e), cap
    return None, cap


def test_internal_error_is_one_line_and_its_traceback_is_kept(ip):
    def broken(self, spec=None, force=False, keep=False):
        return {}["no such key"]  # a bug of pgnb's, as it would look

    with mock.patch.object(pgnb.Sandbox, "init", broken):
        err, _ = _line_magic(ip, "pg_init", "--world 2")
    assert err is not None and "\n" not in err
    assert err.startswith("pgnb internal error in %pg_init while starting the world (KeyError: 'no such key'); ")
    assert "%pg_init ... --force" in err and "%pg_status --debug" in err
    set_current(None)
    err, cap = _line_magic(ip, "pg_status", "--debug")
    assert err is None
    assert "%pg_init while starting the world" in cap.stdout
    assert "Traceback (most recent call last)" in cap.stdout and "KeyError: 'no such key'" in cap.stdout
    assert "in broken" in cap.stdout  # the whole traceback, down to the line that failed


def test_internal_error_is_where_debug_and_tb_find_it_while_the_cell_shows_one_line(ip):
    def broken(self, spec=None, force=False, keep=False):
        return {}["no such key"]

    ip.run_cell("1 / 0")  # an older error, whose traceback IPython formatted (and would debug)
    with mock.patch.object(pgnb.Sandbox, "init", broken), capture_output() as cap:
        result = ip.run_cell("%pg_init --world 2")
    set_current(None)
    assert isinstance(result.error_in_exec, UsageError)
    assert cap.stdout == ""
    assert cap.stderr.startswith("UsageError: pgnb internal error in %pg_init while starting the world")
    assert cap.stderr.count("\n") == 1
    err = sys.last_value
    assert sys.last_type is KeyError and isinstance(err, KeyError) and sys.last_traceback is err.__traceback__
    if sys.version_info >= (3, 12):
        assert sys.last_exc is err
    innermost = sys.last_traceback
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    assert innermost.tb_frame.f_code.co_name == "broken"

    with capture_output() as cap:
        ip.run_line_magic("tb", "")
    assert "KeyError" in cap.stdout and "broken" in cap.stdout and "ZeroDivisionError" not in cap.stdout

    debugged = []
    with mock.patch("IPython.core.debugger.Pdb.interaction", lambda pdb, frame, tb_or_exc: debugged.append(
            (pdb.botframe, tb_or_exc))):
        ip.run_line_magic("debug", "")
    [(botframe, seen)] = debugged
    assert seen is err and botframe.f_code.co_name != "<module>"  # the frames of pgnb's error, not 1 / 0's


def test_a_user_error_after_an_internal_one_stays_the_last(ip):
    def broken(self, spec=None, force=False, keep=False):
        return {}["k"]

    with mock.patch.object(pgnb.Sandbox, "init", broken), capture_output():
        ip.run_cell("try:\n    get_ipython().run_line_magic('pg_init', '--world 2')\nexcept Exception:\n    pass\n"
                    "1 / 0")
    set_current(None)
    assert sys.last_type is ZeroDivisionError


def test_interrupted_lifecycle_call_is_one_line(ip):
    def interrupted(self, spec=None, force=False, keep=False):
        raise Interrupted("init", "starting the controller", "pgnb stopped what it had started; nothing is running")

    with mock.patch.object(pgnb.Sandbox, "init", interrupted):
        err, _ = _line_magic(ip, "pg_init", "--world 2")
    assert err == ("%pg_init interrupted while starting the controller; "
                   "pgnb stopped what it had started; nothing is running")


def test_bare_keyboard_interrupt_in_a_magic_is_one_line(ip):
    def stopped(self, spec=None, force=False, keep=False):
        raise KeyboardInterrupt

    with mock.patch.object(pgnb.Sandbox, "init", stopped):
        err, _ = _line_magic(ip, "pg_init", "--world 2")
    assert err is not None and err.startswith("%pg_init interrupted while starting the world; ")


def test_status_debug_without_errors_or_world(ip):
    err, cap = _line_magic(ip, "pg_status", "--debug")
    assert err is None and cap.stdout.strip() == "pgnb: no internal error in this kernel"
    err, _ = _line_magic(ip, "pg_status", "--bogus")
    assert err is not None and "unrecognized arguments: --bogus" in err
