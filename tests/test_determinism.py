"""Determinism: the same program, inputs and config give the same cycles, trace and bytes on every run,
also in a fresh interpreter with a different hash seed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np

from tpusim.config import load_config, with_overrides
from tpusim.devices import System
from tpusim.isa import (
    Barrier,
    Const,
    DmaStart,
    MemRef,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    Program,
    Reg,
    ScalarAlu,
    SemWait,
    Space,
    Stream,
    Symbol,
    VpuMap,
)
from tpusim.memory import parse_shape


def build() -> tuple[System, Program, dict]:
    cfg = with_overrides(load_config("teaching"), {"core.count": 2})
    w = parse_shape("bf16[8,8]{1,0:T(8,8)(2,1)}")
    a = parse_shape("bf16[32,8]{1,0:T(8,8)(2,1)}")
    o = parse_shape("f32[32,8]{1,0:T(8,8)}")

    def core(k: int) -> Stream:
        base = 0x1000 * k
        return Stream(
            k,
            (
                DmaStart(MemRef(Space.HBM, 0x0, w), MemRef(Space.VMEM, 0x0, w), sem=0),
                DmaStart(MemRef(Space.HBM, 0x100 + 0x200 * k, a), MemRef(Space.VMEM, 0x100, a), sem=0),
                SemWait(0, 2),
                MxuLoadWeights(0, MemRef(Space.VMEM, 0x0, w)),
                MxuMatmul(0, MemRef(Space.VMEM, 0x100, a)),
                MxuPop(0, MemRef(Space.VMEM, 0x400, o)),
                VpuMap("tanh", MemRef(Space.VMEM, 0x800, o), (MemRef(Space.VMEM, 0x400, o),)),
                VpuMap("add", MemRef(Space.VMEM, 0x800, o), (MemRef(Space.VMEM, 0x800, o), Const(0.5, "f32"))),
                DmaStart(MemRef(Space.VMEM, 0x800, o), MemRef(Space.HBM, 0x4000 + base, o), sem=1),
                ScalarAlu("chip_id", Reg(1)),
                ScalarAlu("sub", Reg(2), 1, Reg(1)),  # the other chip
                DmaStart(MemRef(Space.VMEM, 0x800, o), MemRef(Space.HBM, 0x8000 + base, o), sem=1, chip=Reg(2)),
                SemWait(1, 2),
                Barrier(scope="system"),
            ),
            chip=None,
        )

    syms = (Symbol("w", MemRef(Space.HBM, 0, w)), Symbol("a", MemRef(Space.HBM, 0x100, parse_shape("bf16[64,8]{1,0}"))))
    rng = np.random.default_rng(11)
    inputs = {
        "w": rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16),
        "a": rng.standard_normal((64, 8)).astype(ml_dtypes.bfloat16),
    }
    return System(cfg, 2), Program((core(0), core(1)), syms), inputs


def digest() -> str:
    system, prog, inputs = build()
    res = system.run(prog, inputs)
    h = hashlib.sha256()
    h.update(str(res.cycles).encode())
    t = res.trace
    for arr in (t.stream, t.index, t.unit, t.issue, t.start, t.end, t.bytes, t.flops):
        h.update(arr.tobytes())
    for chip in range(2):
        h.update(res.memory("hbm", chip).read(0, 0xA000).tobytes())
        for c in range(2):
            h.update(res.memory("vmem", chip, c).read(0, 0x1000).tobytes())
    return h.hexdigest()


def test_repeated_runs_are_identical():
    first = digest()
    assert all(digest() == first for _ in range(2))


def test_a_fresh_interpreter_with_another_hash_seed_agrees():
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_determinism import digest
        print(digest())
    """)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == digest()


def test_the_program_did_real_work():
    system, prog, inputs = build()
    res = system.run(prog, inputs)
    assert res.cycles > 100 and len(res.trace) == 4 * 14
    mine = res.memory("hbm", 1).read(0x4000, 32 * 8 * 4).view(np.float32)
    remote = res.memory("hbm", 1).read(0x8000, 32 * 8 * 4).view(np.float32)  # written by chip 0
    assert np.all(mine >= -0.5) and np.all(mine <= 1.5) and mine.std() > 0.1  # tanh(...) + 0.5
    np.testing.assert_array_equal(mine, remote)  # both chips computed the same from the same inputs
