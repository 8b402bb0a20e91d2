"""tpusim.gcpause: the cyclic collector is off inside a phase (and a run) and back as it was after it."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tpusim.devices import Chip
from tpusim.gcpause import paused_gc
from tpusim.isa import Fallback, FallbackKernel, MemRef, Program, Space
from tpusim.memory import parse_shape


def test_the_collector_is_paused_and_restored_even_when_the_phase_fails() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # (a phase inside another leaves it paused for the outer one)
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("a failing phase")
    assert gc.isenabled()


def test_a_caller_that_disabled_the_collector_keeps_it_disabled() -> None:
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_run_pauses_the_collector_while_it_simulates_and_restores_it_after() -> None:
    """A run keeps every trace record and transfer fact alive: full collections rescanning them took 40% of a
    256-chip all-reduce (benchmarks/bench_allreduce.py); its few cycles wait for the end of the run."""
    a = MemRef(Space.VMEM, 0, parse_shape("f32[4]{0}"))
    prog = Program.single([Fallback("k", (a,), (a,))], fallbacks=[FallbackKernel("k", "HloModule ignored")])
    seen = []

    def evaluator(hlo: str, xs: list[np.ndarray]) -> list[np.ndarray]:
        seen.append(gc.isenabled())
        return [xs[0]]

    assert gc.isenabled()
    Chip("teaching").run(prog, fallback_evaluator=evaluator)
    assert seen == [False] and gc.isenabled()

    def failing(hlo: str, xs: list[np.ndarray]) -> list[np.ndarray]:
        raise ValueError("a failing kernel")

    with pytest.raises(Exception, match="a failing kernel"):
        Chip("teaching").run(prog, fallback_evaluator=failing)
    assert gc.isenabled()


def test_tpusim_run_leaves_the_collector_enabled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``tpusim run`` pauses the collector for the whole command and freezes what it leaves alive; a caller
    of ``tpusim.cli.main`` in the same process gets it back enabled."""
    from tpusim.cli import main

    program = tmp_path / "p.hlo"
    program.write_text("HloModule m\nENTRY e {\n  a = f32[8,128] parameter(0)\n  ROOT n = f32[8,128] negate(a)\n}\n")
    assert main(["run", str(program), "--timing-only"]) == 0
    assert gc.isenabled()
    gc.unfreeze()  # (give this test session's objects back to the collector)
