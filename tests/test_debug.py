"""Debugging a rank from the notebook: ``breakpoint()`` in ``%%pg``, ``%pg_debug``, ``%%pg --pdb``.

In a real Jupyter kernel, with ``allow_stdin=True``, answering the kernel's ``input_request`` messages as a
frontend does; and with ``allow_stdin=False`` (nbval, ``jupyter execute``), where a breakpoint is skipped with
one line. From Python, ``Sandbox.execute(on_input=...)`` and ``Sandbox.debug``.
"""

from __future__ import annotations

import queue
import time

import pytest

pytestmark = pytest.mark.integration

CELL = "x = 40 + rank\nbreakpoint()\ny = x + 1\nprint(y)\n"


def converse(kernel, code: str, answers: list[str], allow_stdin: bool = True, on_prompt=None, timeout: float = 60,
             stderr: list[str] | None = None):
    """Run ``code``; answer each input request with the next answer. Returns (prompts, stdout, reply);
    what the cell wrote on stderr is appended to ``stderr`` if one is given."""
    msg_id = kernel.kc.execute(code, allow_stdin=allow_stdin)
    prompts: list[str] = []
    stdout = []
    pending = list(answers)
    deadline = time.monotonic() + timeout
    idle = False
    while not idle:
        assert time.monotonic() < deadline, (prompts, "".join(stdout))
        try:
            msg = kernel.kc.get_stdin_msg(timeout=0.05)
        except queue.Empty:
            msg = None
        if msg is not None and msg["msg_type"] == "input_request":
            prompts.append(msg["content"]["prompt"])
            if on_prompt is not None and on_prompt(len(prompts)):
                continue  # the test does something else at this prompt (an interrupt)
            kernel.kc.input(pending.pop(0) if pending else "c")
        while True:
            try:
                io = kernel.kc.get_iopub_msg(timeout=0.01)
            except queue.Empty:
                break
            if io["parent_header"].get("msg_id") != msg_id:
                continue
            if io["msg_type"] == "stream" and io["content"]["name"] == "stdout":
                stdout.append(io["content"]["text"])
            if io["msg_type"] == "stream" and io["content"]["name"] == "stderr" and stderr is not None:
                stderr.append(io["content"]["text"])
            if io["msg_type"] == "status" and io["content"]["execution_state"] == "idle":
                idle = True
    while True:
        reply = kernel.kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return prompts, "".join(stdout), reply["content"]


@pytest.fixture(scope="module")
def kernel(kernel2):
    return kernel2


@pytest.mark.kernel
def test_a_breakpoint_on_one_rank_is_answered_from_the_notebook(kernel):
    prompts, out, reply = converse(kernel, "%%pg --ranks 1\n" + CELL, ["p x", "c"])
    assert reply["status"] == "ok", reply
    assert prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
    assert "Cell, line 2" in out and "41\n" in out  # the cell's own line, and `p x`
    assert out.endswith("[rank 1]\n42\n")


@pytest.mark.kernel
def test_breakpoints_on_every_rank_are_served_one_at_a_time_in_rank_order(kernel):
    prompts, out, reply = converse(kernel, "%%pg\n" + CELL, ["p x", "c", "p x", "c"])
    assert reply["status"] == "ok", reply
    assert prompts == ["(Pdb rank 0) "] * 2 + ["(Pdb rank 1) "] * 2
    assert "40\n" in out and "41\n" in out
    assert out.endswith("[rank 0]\n41\n[rank 1]\n42\n")


@pytest.mark.kernel
def test_q_ends_the_ranks_cell_in_one_line_and_the_next_cell_runs(kernel):
    prompts, out, reply = converse(kernel, "%%pg --ranks 1\n" + CELL, ["q"])
    assert reply["status"] == "error" and prompts == ["(Pdb rank 1) "]
    assert reply["evalue"] == "rank 1 quit in the debugger"
    prompts, out, reply = converse(kernel, "%%pg\nprint('next', rank)", [])
    assert reply["status"] == "ok" and prompts == [] and "next 0" in out and "next 1" in out


@pytest.mark.kernel
def test_time_at_the_prompt_does_not_count_against_the_timeout(kernel):
    def slow(n):
        time.sleep(3)  # the user reads the code a while
        return False

    prompts, out, reply = converse(kernel, "%%pg --ranks 1 --timeout 2\n" + CELL, ["c"], on_prompt=slow)
    assert reply["status"] == "ok", reply
    assert out.endswith("[rank 1]\n42\n")


@pytest.mark.kernel
def test_the_interrupt_button_at_a_prompt_leaves_the_debugger_and_interrupts_the_cell(kernel):
    def interrupt(n):
        kernel.km.interrupt_kernel()
        return True

    prompts, out, reply = converse(kernel, "%%pg --ranks 1\n" + CELL, [], on_prompt=interrupt)
    assert reply["status"] == "error" and reply["evalue"].startswith("interrupted"), reply
    prompts, out, reply = converse(kernel, "%%pg\nprint('after', rank)", [])
    assert reply["status"] == "ok" and "after 1" in out


@pytest.mark.kernel
def test_pg_debug_opens_pdb_where_the_rank_raised(kernel):
    prompts, out, reply = converse(kernel, "%%pg\nshard = [1, 2, 3][rank:]\nscale = 10 / (len(shard) - 2)\n", [])
    assert reply["status"] == "error" and "rank 1 raised ZeroDivisionError" in reply["evalue"]
    prompts, out, reply = converse(kernel, "%pg_debug 1", ["p shard", "p len(shard)", "q"])
    assert reply["status"] == "ok", reply
    assert prompts[0] == "(Pdb rank 1) "
    assert "Cell, line 2" in out and "scale = 10 / (len(shard) - 2)" in out  # the failing line
    assert "[2, 3]\n" in out and "2\n" in out
    # no argument: the first rank that failed in the last cell; frames are gone after the next cell
    converse(kernel, "%%pg\nprint(rank)", [])
    prompts, out, reply = converse(kernel, "%pg_debug 1", [])
    assert reply["status"] == "error" and "no failed cell to debug" in reply["evalue"]


@pytest.mark.kernel
def test_pg_pdb_opens_the_debugger_by_itself(kernel):
    prompts, out, reply = converse(kernel, "%%pg --pdb --ranks 1\nz = 7 * rank\n1 / 0\n", ["p z", "c"])
    assert prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "]
    assert "7\n" in out and "1 / 0" in out
    assert reply["status"] == "error" and "ZeroDivisionError" in reply["evalue"]


@pytest.mark.kernel
def test_where_nothing_can_answer_a_breakpoint_is_skipped_with_one_line(kernel):
    t0 = time.monotonic()
    err: list[str] = []
    prompts, out, reply = converse(kernel, "%%pg\n" + CELL, [], allow_stdin=False, stderr=err)
    assert time.monotonic() - t0 < 5 and prompts == [] and reply["status"] == "ok", reply
    assert out.endswith("[rank 0]\n41\n[rank 1]\n42\n")
    # each rank's one line on the cell's stderr, in rank order (the line names its rank), and nothing else
    why = "this frontend takes no input (nbval, jupyter execute, allow_stdin=False)"
    assert "".join(err) == "".join(f"breakpoint skipped on rank {r}: {why}\n" for r in range(2))


def test_from_python_on_input_answers_and_without_it_the_note_is_in_the_result(world4):
    asked = []
    answers = iter(["p x", "c"])

    def on_input(rank, text):
        asked.append((rank, text))
        return next(answers)

    res = world4.execute(CELL, ranks=[2], on_input=on_input)
    assert res.error() is None and res.text() == "[rank 2]\n43\n"
    assert [r for r, _ in asked] == [2, 2] and asked[0][1].endswith("(Pdb rank 2) ") and asked[1][1].startswith("42")
    res = world4.execute(CELL)
    assert res.error() is None
    for r in range(4):
        assert res.ranks[r].stderr == (f"breakpoint skipped on rank {r}: no input is possible here "
                                       "(pass on_input= to Sandbox.execute)\n")
