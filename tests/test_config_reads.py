"""What a compilation reads of the chip config (tpusim/compiler/config_reads.py), and a sweep compiling once
per distinct set of those values (tpusim/sweep/point.py). The record is checked against the compiler: a
key outside it, changed, leaves the compiled program identical."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import tpusim
from tpusim.compiler.config_reads import recorded_reads
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.options import CompileOptions
from tpusim.config import ChipConfig, ConfigError, load_config
from tpusim.sweep.point import compiled_for

PROGRAMS = Path(__file__).resolve().parent.parent / "configs/sweeps/programs"
BLOCK = (PROGRAMS / "transformer_block.hlo").read_text()


def _leaves(obj: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _leaves(value, (*path, f.name))
        elif path or f.name == "clock_hz":  # (the chip's name, source and overrides are labels)
            out.append(((*path, f.name), value))
    return out


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return 2 * value if value else 1
    if isinstance(value, float):
        return 1.5 * value if value else 1.0
    return None


def _program(config: ChipConfig) -> tuple[Any, ...]:
    compiled = tpusim.compile_program(parse_module(BLOCK), config=config)
    return tuple(tuple(s.instructions) for s in compiled.program.streams)


def test_a_compilation_records_the_keys_it_reads() -> None:
    config = load_config("tpu_v5e")
    with recorded_reads(config) as reads:
        tpusim.compile_program(parse_module(BLOCK), config=config)
    assert {("hbm", "bandwidth_bytes_per_s"), ("mxu", "rows"), ("vmem", "bytes"), ("clock_hz",)} <= reads
    assert not any(p[0] in ("ici", "xlu") for p in reads)
    assert ("vpu", "alu", "issue_vregs_per_cycle") not in reads
    assert type(config.hbm).__getattribute__ is object.__getattribute__  # the watch is gone


def test_keys_outside_the_record_leave_the_program_as_it_is() -> None:
    """Every numeric or boolean key of tpu_v5e the compilation did not read, changed one at a time (to
    twice its value, or the other truth value), compiles the transformer block to the same program."""
    base = load_config("tpu_v5e")
    with recorded_reads(base) as reads:
        want = _program(base)
    tried = 0
    for path, value in _leaves(base):
        new = _changed(value)
        if path in reads or new is None:
            continue
        try:
            config = load_config("tpu_v5e", [f"{'.'.join(path)}={str(new).lower()}"])
        except ConfigError:
            continue  # (a value the config refuses, such as an inconsistent published figure)
        tried += 1
        assert _program(config) == want, f"{'.'.join(path)} changes the program but was not recorded"
    assert tried >= 15, tried


def test_a_sweep_over_keys_the_compiler_does_not_read_compiles_once() -> None:
    options = CompileOptions()
    # (the block's softmax and norms; at 16 cycles or fewer their lane reductions hide under its transfers)
    a = load_config("tpu_v5e", ["xlu.lane_reduce_cycles_per_vreg=64"])
    b = load_config("tpu_v5e", ["xlu.lane_reduce_cycles_per_vreg=4"])
    first, second = compiled_for(BLOCK, a, options), compiled_for(BLOCK, b, options)
    assert second.program is first.program and second.config == b
    fresh = tpusim.simulate(BLOCK, config=b, timing_only=True)
    assert tpusim.simulate(second, timing_only=True).cycles == fresh.cycles
    assert fresh.cycles != tpusim.simulate(first, timing_only=True).cycles  # (the key matters to timing)
    rows = compiled_for(BLOCK, load_config("tpu_v5e", ["mxu.rows=64", "mxu.cols=64"]), options)
    assert rows.program is not first.program


@pytest.mark.parametrize("key", ["hbm.latency_ns=500", "clock_hz=2e9"])
def test_keys_the_compiler_reads_compile_again(key: str) -> None:
    options = CompileOptions()
    base = compiled_for(BLOCK, load_config("tpu_v5e"), options)
    assert compiled_for(BLOCK, load_config("tpu_v5e", [key]), options).program is not base.program


def test_a_sweep_over_keys_the_compiler_reads_keeps_a_few_compilations() -> None:
    """A worker keeps at most four compilations per program, so a long sweep over HBM bandwidth does not
    hold one compiled program per point."""
    from tpusim.sweep import point

    options = CompileOptions(fuse=False)  # (a key of its own in the worker's cache)
    for gbps in (400, 500, 600, 700, 800, 900):
        compiled_for(BLOCK, load_config("tpu_v5e", [f"hbm.bandwidth_bytes_per_s={gbps}e9"]), options)
    kept = [entries for (_, opts), entries in point._COMPILED.items() if opts == options]
    assert len(kept) == 1 and len(kept[0]) == 4
