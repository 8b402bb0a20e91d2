"""tpusim.gcpause: the cyclic collector is off inside a phase and back as it was after it."""

from __future__ import annotations

import gc

import pytest

from tpusim.gcpause import paused_gc


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
