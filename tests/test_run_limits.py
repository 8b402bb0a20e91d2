"""Run limits (issue 13, "Runs that end"): an endless ``while`` stops with one line naming the loop, in every
mode, and Ctrl-C ends ``tpusim run`` with one line saying where the simulation was and exit status 130.

Every test here uses small explicit limits, so an endless loop stops within a second or two; the defaults are
checked by value, never by running to them.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tpusim
from tpusim.api import load_program, simulate_chips
from tpusim.cli import main
from tpusim.compiler.hlo.reference import evaluate, evaluate_spmd
from tpusim.devices import System
from tpusim.errors import TpusimError
from tpusim.limits import DEFAULT_MAX_CYCLES, DEFAULT_MAX_STEPS, RunLimitError

ENDLESS = """HloModule endless

cond {
  p = (s32[], f32[8,128]) parameter(0)
  ROOT t = pred[] constant(true)
}

body {
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  x = f32[8,128] get-tuple-element(p), index=1
  y = f32[8,128] add(x, x)
  ROOT r = (s32[], f32[8,128]) tuple(j, y)
}

ENTRY main {
  a = f32[8,128] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8,128]) tuple(zero, a)
  spin = (s32[], f32[8,128]) while(init), condition=cond, body=body
  ROOT out = f32[8,128] get-tuple-element(spin), index=1
}
"""
SPIN_LINE = 22  # the line of %spin in ENDLESS

# An endless outer loop around an inner loop of 3 trips (outer_endless=True), or a 3-trip outer loop around an
# endless inner one: the message names the loop that does not end.
NESTED = """HloModule nested

inner_cond {{
  p = (s32[], f32[8,128]) parameter(0)
  k = s32[] get-tuple-element(p), index=0
  n = s32[] constant({inner_trips})
  ROOT lt = pred[] compare(k, n), direction=LT
}}

inner_body {{
  p = (s32[], f32[8,128]) parameter(0)
  k = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  k1 = s32[] add(k, one)
  x = f32[8,128] get-tuple-element(p), index=1
  y = f32[8,128] add(x, x)
  ROOT r = (s32[], f32[8,128]) tuple(k1, y)
}}

outer_cond {{
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant({outer_trips})
  ROOT lt = pred[] compare(i, n), direction=LT
}}

outer_body {{
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x = f32[8,128] get-tuple-element(p), index=1
  zero = s32[] constant(0)
  start = (s32[], f32[8,128]) tuple(zero, x)
  innerloop = (s32[], f32[8,128]) while(start), condition=inner_cond, body=inner_body
  y = f32[8,128] get-tuple-element(innerloop), index=1
  ROOT r = (s32[], f32[8,128]) tuple(i1, y)
}}

ENTRY main {{
  a = f32[8,128] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8,128]) tuple(zero, a)
  outerloop = (s32[], f32[8,128]) while(init), condition=outer_cond, body=outer_body
  ROOT out = f32[8,128] get-tuple-element(outerloop), index=1
}}
"""
FOREVER = 2**31 - 1  # a trip count no test reaches

# an endless while inside the true branch of a conditional: the message names the branch's computation
IN_BRANCH = """HloModule branchy

cond {
  p = (s32[], f32[8,128]) parameter(0)
  ROOT t = pred[] constant(true)
}

body {
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  x = f32[8,128] get-tuple-element(p), index=1
  ROOT r = (s32[], f32[8,128]) tuple(j, x)
}

on_true {
  x = f32[8,128] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8,128]) tuple(zero, x)
  stuck = (s32[], f32[8,128]) while(init), condition=cond, body=body
  ROOT y = f32[8,128] get-tuple-element(stuck), index=1
}

on_false {
  ROOT x = f32[8,128] parameter(0)
}

ENTRY main {
  a = f32[8,128] parameter(0)
  go = pred[] constant(true)
  ROOT out = f32[8,128] conditional(go, a, a), true_computation=on_true, false_computation=on_false
}
"""

STRAIGHT = """HloModule add
ENTRY main {
  x = f32[8,128] parameter(0)
  ROOT y = f32[8,128] add(x, x)
}
"""

ONES = [np.ones((8, 128), np.float32)]


def _stopped(fn, *args, **kwargs) -> RunLimitError:  # type: ignore[no-untyped-def]
    """The RunLimitError ``fn`` raises, checked to come within a few seconds and to be one line."""
    began = time.perf_counter()
    with pytest.raises(RunLimitError) as info:
        fn(*args, **kwargs)
    assert time.perf_counter() - began < 20  # (a few seconds on a busy machine; endless without the limit)
    assert "\n" not in str(info.value)
    return info.value


# ------------------------------------------------------------------------------------------- the device
@pytest.mark.parametrize("timing_only", [False, True], ids=["numeric", "timing-only"])
def test_endless_while_on_the_device_stops_at_max_steps(timing_only: bool) -> None:
    err = _stopped(tpusim.simulate, ENDLESS, ONES, config="teaching", timing_only=timing_only, max_steps=2_000)
    message = str(err)
    assert message.startswith(f"max_steps=2,000 reached: while %spin (computation main, line {SPIN_LINE}) had run ")
    assert "raise the limit with --max-steps N (Python: max_steps=N)" in message
    assert "an endless loop?" in message
    hit = err.hit
    assert hit is not None and (hit.loop, hit.opcode, hit.computation) == ("spin", "while", "main")
    # ~14 instructions per iteration; the limit is checked at each jump back, so at most one pass past it
    assert 100 <= hit.iterations <= 2_000 // 2
    executed = int(re.search(r"with ([\d,]+) instructions executed", message)[1].replace(",", ""))  # type: ignore[index]
    assert 2_000 <= executed < 2_000 + 20
    assert "(chip 0 core 0)" in message


@pytest.mark.parametrize("timing_only", [False, True], ids=["numeric", "timing-only"])
def test_endless_while_on_the_device_stops_at_max_cycles(timing_only: bool) -> None:
    err = _stopped(tpusim.simulate, ENDLESS, ONES, config="teaching", timing_only=timing_only, max_cycles=50_000)
    message = str(err)
    assert message.startswith("max_cycles=50,000 reached: while %spin (computation main, line 22) had run ")
    assert "raise the limit with --max-cycles N (Python: max_cycles=N)" in message
    cycle = int(re.search(r"at cycle ([\d,]+)", message)[1].replace(",", ""))  # type: ignore[index]
    assert 50_000 < cycle < 60_000


def test_both_modes_stop_at_the_same_place() -> None:
    """Timing-only runs take the cycles of numeric runs, so a cycle limit stops both at the same iteration."""
    a = _stopped(tpusim.simulate, ENDLESS, ONES, config="teaching", max_cycles=30_000)
    b = _stopped(tpusim.simulate, ENDLESS, ONES, config="teaching", timing_only=True, max_cycles=30_000)
    assert str(a) == str(b)


@pytest.mark.parametrize(
    ("outer", "inner", "named"),
    [(FOREVER, 3, "outerloop"), (3, FOREVER, "innerloop")],
    ids=["endless-outer", "endless-inner"],
)
def test_the_loop_named_is_the_one_that_does_not_end(outer: int, inner: int, named: str) -> None:
    program = NESTED.format(outer_trips=outer, inner_trips=inner)
    for kw in ({}, {"timing_only": True}):
        err = _stopped(tpusim.simulate, program, ONES, config="teaching", max_steps=3_000, **kw)  # type: ignore[arg-type]
        computation = "main" if named == "outerloop" else "outer_body"
        assert str(err).startswith(f"max_steps=3,000 reached: while %{named} (computation {computation}, line ")
        assert err.hit is not None and err.hit.iterations > 10  # the count of the current execution, not 3
    ref = _stopped(evaluate, load_program(program), ONES, max_steps=300)
    assert ref.hit is not None and ref.hit.loop == named
    assert ref.hit.iterations > 50


def test_a_loop_in_a_conditional_names_its_computation() -> None:
    err = _stopped(tpusim.simulate, IN_BRANCH, ONES, config="teaching", max_steps=1_000)
    assert "while %stuck (computation on_true, line " in str(err)
    ref = _stopped(evaluate, load_program(IN_BRANCH), ONES, max_steps=100)
    assert str(ref).startswith("max_steps=100 reached: while %stuck (computation on_true, line ")


def test_finite_loops_run_under_the_limits_and_a_short_limit_stops_them() -> None:
    program = NESTED.format(outer_trips=3, inner_trips=3)
    done = tpusim.simulate(program, ONES, config="teaching")
    np.testing.assert_array_equal(done.outputs[0], np.full((8, 128), 2.0**9, np.float32))
    assert tpusim.simulate(program, ONES, config="teaching", max_steps=done.instructions).cycles == done.cycles
    _stopped(tpusim.simulate, program, ONES, config="teaching", max_steps=done.instructions // 2)
    np.testing.assert_array_equal(evaluate(load_program(program), ONES, max_steps=12)[0], done.outputs[0])
    _stopped(evaluate, load_program(program), ONES, max_steps=11)  # 3 outer + 3 x 3 inner iterations


def test_a_run_without_loops_that_ends_past_a_limit_says_so() -> None:
    done = tpusim.simulate(STRAIGHT, ONES, config="teaching")
    err = _stopped(tpusim.simulate, STRAIGHT, ONES, config="teaching", max_cycles=done.cycles - 1)
    assert str(err).startswith(f"max_cycles={done.cycles - 1:,} passed: no loop was running, the run ended at cycle")
    err = _stopped(tpusim.simulate, STRAIGHT, ONES, config="teaching", max_steps=done.instructions - 1)
    assert str(err).startswith(f"max_steps={done.instructions - 1:,} passed: no loop was running")


def test_many_chips_stop_too() -> None:
    err = _stopped(
        simulate_chips, ENDLESS, [np.ones((2, 8, 128), np.float32)], chips=2, config="teaching", max_steps=2_000
    )
    assert str(err).startswith("max_steps=2,000 reached: while %spin (computation main, line 22) had run ")


def test_simulate_jax_takes_the_limits() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def spin(x):  # type: ignore[no-untyped-def]
        return jax.lax.while_loop(lambda c: c[0] >= 0, lambda c: (c[0] | 1, c[1] * 2.0), (jnp.int32(0), x))[1]

    x = jnp.ones((8, 128), jnp.float32)
    err = _stopped(tpusim.simulate_jax, spin, x, config="teaching", max_steps=2_000)
    assert re.match(r"max_steps=2,000 reached: while %\S+ \(computation \S+, line \d+", str(err)), str(err)
    err = _stopped(tpusim.simulate_jax, spin, x, config="teaching", timing_only=True, max_cycles=40_000)
    assert str(err).startswith("max_cycles=40,000 reached: while %")


# ------------------------------------------------------------------------------------------- the reference
def test_endless_while_in_the_reference_stops_at_max_steps() -> None:
    err = _stopped(evaluate, load_program(ENDLESS), ONES, max_steps=1_000)
    assert str(err) == (
        "max_steps=1,000 reached: while %spin (computation main, line 22) had run 1,000 iterations, after 1,000 "
        "while iterations in all (the reference interpreter); an endless loop? raise the limit with --max-steps N "
        "(Python: max_steps=N)"
    )


def test_endless_while_on_several_reference_devices() -> None:
    err = _stopped(evaluate_spmd, load_program(ENDLESS), [ONES, ONES], num_devices=2, max_steps=500)
    assert "while %spin" in str(err)
    assert "(the reference interpreter, device " in str(err)


# ------------------------------------------------------------------------------------------- limits themselves
def test_default_limits_are_finite_and_everywhere_the_same() -> None:
    assert DEFAULT_MAX_STEPS == 10_000_000
    assert DEFAULT_MAX_CYCLES == 2**48 < 2**53
    for fn in (tpusim.simulate, simulate_chips, System.run):
        params = inspect.signature(fn).parameters
        assert params["max_steps"].default == DEFAULT_MAX_STEPS, fn
        assert params["max_cycles"].default == DEFAULT_MAX_CYCLES, fn
    for fn in (evaluate, evaluate_spmd):
        assert inspect.signature(fn).parameters["max_steps"].default == DEFAULT_MAX_STEPS
    from tpusim.cli import build_parser

    args = build_parser().parse_args(["run", "p.hlo"])
    assert args.max_steps == DEFAULT_MAX_STEPS
    assert args.max_cycles is None  # -> DEFAULT_MAX_CYCLES (None tells a --reference run it was not given)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"max_steps": 0}, "max_steps must be a positive integer, not '0'"),
        ({"max_steps": -5}, "max_steps must be a positive integer"),
        ({"max_steps": 2.5}, "max_steps must be a positive integer"),
        ({"max_steps": True}, "max_steps must be a positive integer"),
        ({"max_cycles": 0}, "max_cycles must be a positive integer"),
        ({"max_cycles": 2**60}, "is past 2^53"),
    ],
)
def test_bad_limits_are_one_line_errors(kw: dict[str, object], expected: str) -> None:
    with pytest.raises(TpusimError, match=re.escape(expected)):
        tpusim.simulate(STRAIGHT, ONES, config="teaching", **kw)  # type: ignore[arg-type]
    if "max_steps" in kw:
        with pytest.raises(TpusimError, match=re.escape(expected)):
            evaluate(load_program(STRAIGHT), ONES, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- the command line
@pytest.fixture
def endless_file(tmp_path: Path) -> Path:
    path = tmp_path / "endless.hlo"
    path.write_text(ENDLESS)
    return path


@pytest.mark.parametrize("mode", [[], ["--timing-only"], ["--reference"]], ids=["numeric", "timing-only", "reference"])
def test_cli_stops_an_endless_loop_with_one_line(
    mode: list[str], endless_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(endless_file), "--config", "teaching", "--max-steps", "1500", *mode]
    out = [] if mode == ["--timing-only"] else ["--out", str(tmp_path / "o.npz")]  # (timing-only writes no outputs)
    assert main([*argv, *out]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"tpusim run: max_steps=1,500 reached: while %spin (computation main, {endless_file}:22)")
    assert err.rstrip().endswith("raise the limit with --max-steps N (Python: max_steps=N)")
    assert not (tmp_path / "o.npz").exists()


def test_cli_max_cycles(endless_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(endless_file), "--config", "teaching", "--max-cycles", "20000"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tpusim run: max_cycles=20,000 reached: while %spin (computation main, ")
    assert "--max-cycles N (Python: max_cycles=N)" in err
    assert main(["run", str(endless_file), "--reference", "--max-cycles", "20000"]) == 1
    assert "cannot be combined with --max-cycles (the oracle has no cycles)" in capsys.readouterr().err
    assert main(["run", str(endless_file), "--config", "teaching", "--max-steps", "-1"]) == 1
    assert capsys.readouterr().err == "tpusim run: max_steps must be a positive integer, not '-1'\n"


# ------------------------------------------------------------------------------------------- Ctrl-C
_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # what Python sets up unless started with it ignored
import tpusim.api, tpusim.cli, tpusim.compiler.hlo.reference, tpusim.devices  # imported before 'ready'
print("ready", flush=True)
sys.exit(tpusim.cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("mode", [[], ["--reference"]], ids=["device", "reference"])
def test_ctrl_c_ends_a_run_with_one_line_and_status_130(mode: list[str], endless_file: Path, tmp_path: Path) -> None:
    """SIGINT to ``tpusim run`` of an endless loop: one line saying where the simulation was, exit status 130.
    (The child installs Python's SIGINT handler itself: a shell starts background jobs with SIGINT ignored,
    and Python then never raises KeyboardInterrupt.)"""
    argv = ["run", str(endless_file), "--config", "teaching", "--out", str(tmp_path / "o.npz"), *mode]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(2.0)  # compiling a small program takes well under a second; then it loops
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    if mode:
        assert re.fullmatch(
            r"tpusim run: interrupted in the reference interpreter: while %spin \(computation main\) on iteration "
            r"[\d,]+, [\d,]+ while iterations in all\n",
            err,
        ), err
    else:
        assert re.fullmatch(
            r"tpusim run: interrupted at cycle [\d,]+ after [\d,]+ instructions; chip 0 core 0 at instruction \d+ "
            r"\(HLO %\w+\), in the loop of %spin after [\d,]+ iterations\n",
            err,
        ), err
