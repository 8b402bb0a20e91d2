"""The dot planner respects the MXU config keys it depends on (issue 15), so what-if sweeps are honest.

* ``mxu.double_buffered: false``: each weight tile's load waits until the previous pass has drained, so a
  pass costs ``L + T + R - 1 + C - 1`` and the planner must stream as many rows through each tile as the
  result buffer holds. The MXU's own timeline is then SCALE-Sim's count for a weight-stationary array,
  ``ceil(K/R) * ceil(N/C) * (2R + C + T - 2)`` per run of ``T`` rows (SCALE-Sim v2,
  ``scalesim/compute/systolic_compute_ws.py``: per fold ``R`` cycles of weight fill, then ``R + C + T - 2``
  while the rows stream and the partial sums drain, folds one after another, ``T`` = the rows of the
  operand matrix; Samajdar et al., "SCALE-Sim: Systolic CNN Accelerator Simulator", arXiv:1811.02883).
  Before, the planner assumed double buffering and streamed 128 rows per tile: 2.92x that count for a
  1024^3 bf16 matmul on one 128x128 MXU.
* ``mxu.weight_load_cycles`` is null (= ``mxu.rows``) in every shipped config, so ``--set mxu.rows=N``
  scales it; before, the files set it to the row count, and an override of ``mxu.rows`` left it behind.
* ``mxu.rows`` / ``mxu.cols``: a compute-bound matmul's cycles follow the array's size.
"""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest
from e2e_support import run_checked

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.config import PRESETS, load_config
from tpusim.isa import MxuMatmul, MxuPop


def dot(m: int, k: int, n: int, dtype: str = "bf16", out: str | None = None) -> str:
    return (
        f"HloModule d\nENTRY main {{\n  a = {dtype}[{m},{k}] parameter(0)\n  b = {dtype}[{k},{n}] parameter(1)\n"
        f"  ROOT c = {out or dtype}[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}"
    )


def scalesim_ws(m: int, k: int, n: int, rows: int, cols: int, t: int) -> int:
    """SCALE-Sim's compute cycles of a weight-stationary ``rows x cols`` array for ``[m,k] @ [k,n]``, the
    operand's rows streamed in runs of ``t`` (the result buffer's capacity; SCALE-Sim's T is all ``m``)."""
    return ceil(m / t) * ceil(k / rows) * ceil(n / cols) * (2 * rows + cols + t - 2)


def mxu_spans(result: tpusim.api.SimulationResult) -> list[int]:
    """Per MXU, its timeline: from its first weight load as it would start with its operands already in VMEM
    (its first matmul's start less one load: before that the MXU waits for the first operand DMAs, which
    SCALE-Sim's compute count leaves out) to its last matmul's end (results drained)."""
    tr, ins = result.trace, result.compiled.program.streams[0].instructions
    load = result.compiled.config.mxu.load_cycles
    spans = []
    for u, name in enumerate(tr.units):
        if ".mxu" not in name:
            continue
        matmuls = [i for i in np.nonzero(tr.unit == u)[0] if isinstance(ins[tr.index[i]], MxuMatmul)]
        spans.append(int(tr.end[matmuls].max()) - int(tr.start[matmuls].min()) + load)
    return spans


def simulate(text: str, overrides: list[str]) -> tpusim.api.SimulationResult:
    return tpusim.simulate(text, config="tpu_v5e", timing_only=True, overrides=overrides)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_weight_load_cycles_follow_rows(name: str) -> None:
    """Every shipped chip loads one weight row per cycle by saying so (null), so an MXU-size override
    scales the load; an explicit value still wins."""
    cfg = load_config(name)
    assert cfg.mxu.weight_load_cycles is None and cfg.mxu.load_cycles == cfg.mxu.rows
    for rows in (64, 256):
        assert load_config(name, overrides=[f"mxu.rows={rows}"]).mxu.load_cycles == rows
    assert load_config(name, overrides=["mxu.rows=256", "mxu.weight_load_cycles=100"]).mxu.load_cycles == 100


@pytest.mark.parametrize("rows", [64, 128, 256])
@pytest.mark.parametrize("m,k,n", [(1024, 1024, 1024), (512, 1024, 256)])
def test_single_buffered_mxu_is_scalesim(m: int, k: int, n: int, rows: int) -> None:
    """One R x R MXU without double buffering: its timeline is SCALE-Sim's count with runs of T = min(M,
    result buffer) rows, plus, where the pop of a T-row block outlasts a weight load (R = 64: 128 pop
    cycles against 64), the difference once per block after the first (the next block overwrites the rows
    being popped). To the cycle but for waits for operands: at R = 256 a step's operand loads (a 1024 x 256
    window of A and a tile of B) take about as long as its pass, and two passes start one cycle late."""
    ov = ["mxu.count=1", "mxu.double_buffered=false", f"mxu.rows={rows}", f"mxu.cols={rows}"]
    result = simulate(dot(m, k, n), ov)
    cfg = result.compiled.config.mxu
    assert cfg.load_cycles == rows
    t = min(m, cfg.result_buffer_rows)
    blocks = ceil(m / t) * ceil(n / cfg.cols)
    pop_wait = max(0, ceil(t / cfg.pop_rows_per_cycle) - cfg.load_cycles)
    want = scalesim_ws(m, k, n, rows, rows, t) + (blocks - 1) * pop_wait
    (span,) = mxu_spans(result)
    assert want <= span <= want + want // 1000, (span, want)
    matmuls = [i for i in result.compiled.program.streams[0].instructions if isinstance(i, MxuMatmul)]
    assert {i.lhs.dims[-2] for i in matmuls} == {t}  # every tile streams a whole run


def test_single_buffered_four_mxus() -> None:
    """v5e without double buffering, 1024^3 bf16: each of the four MXUs takes two of the eight 128-wide
    weight columns, and its timeline is SCALE-Sim's count for that share (T = 1024), plus at most the
    first block's pops of the other MXUs (one block's pops write interleaved windows, which the scoreboard
    orders). Before: 67,634 cycles, 3.0x the count of 22,496; now 26,833 (the rest is the first operand
    loads and the last block's pop and its 1 MiB store)."""
    result = simulate(dot(1024, 1024, 1024), ["mxu.double_buffered=false"])
    count = scalesim_ws(1024, 1024, 256, 128, 128, 1024)  # one MXU's quarter of N
    for span in mxu_spans(result):
        assert count <= span <= count + 3 * 128
    assert result.cycles < 1.25 * count


@pytest.mark.parametrize("m,k,n", [(1024, 1024, 1024), (512, 1024, 256)])
def test_double_buffering_hides_weight_loads(m: int, k: int, n: int) -> None:
    """The same products on one MXU with double buffering: each pass costs max(L, T) (T >= L), so the
    timeline is the stream bound plus one load and one drain, within 2% (the planner streams T = L = 128
    rows per pass, so nothing absorbs the first steps' late operands); faster than single buffering."""
    cfg = load_config("tpu_v5e").mxu
    single = simulate(dot(m, k, n), ["mxu.count=1", "mxu.double_buffered=false"])
    double = simulate(dot(m, k, n), ["mxu.count=1"])
    (span,) = mxu_spans(double)
    bound = m * ceil(k / cfg.rows) * ceil(n / cfg.cols) + cfg.load_cycles + cfg.rows + cfg.cols - 2
    assert bound <= span <= 1.02 * bound
    assert double.cycles < single.cycles


@pytest.mark.parametrize("buffered", [True, False])
def test_mxu_size_what_if(buffered: bool) -> None:
    """A compute-bound matmul (bf16 1024x2048x2048 on one MXU: 16 MiB of HBM traffic, about 30,700 cycles,
    against 65,536 MXU cycles at 256x256) slows as the MXU shrinks, 64x64, 128x128, 256x256, as the
    array's analytic count says: the stream bound M K N / (R C) plus a load and a drain double-buffered,
    SCALE-Sim's count single-buffered. The MXU's timeline is within 3% of it (exact single-buffered but
    for R = 64's pop waits, see above); the program's cycles add the first loads and the last store, and
    their ratio between consecutive sizes is within 10% of the analytic ratio (4x double-buffered; 3.45x
    and 3.14x single-buffered, where every pass also pays 2R + C - 2). Before, single-buffered: 3.42x
    and 1.17x (394,407 cycles at 256x256, 3.4x SCALE-Sim's count), since 128-row passes paid the fixed
    cost 8 times over and 256x256 kept 128-cycle loads."""
    m, k, n = 1024, 2048, 2048
    cycles, analytic = {}, {}
    for r in (64, 128, 256):
        ov = ["mxu.count=1", f"mxu.rows={r}", f"mxu.cols={r}", f"mxu.double_buffered={str(buffered).lower()}"]
        result = simulate(dot(m, k, n), ov)
        cfg = result.compiled.config.mxu
        if buffered:
            analytic[r] = m * k * n // (r * r) + cfg.load_cycles + 2 * r - 2
        else:
            t = min(m, cfg.result_buffer_rows)
            pop_wait = max(0, ceil(t / cfg.pop_rows_per_cycle) - cfg.load_cycles)
            analytic[r] = scalesim_ws(m, k, n, r, r, t) + (ceil(m / t) * ceil(n / r) - 1) * pop_wait
        (span,) = mxu_spans(result)
        assert analytic[r] <= span <= 1.03 * analytic[r], (r, span, analytic[r])
        cycles[r] = result.cycles
    for small, big in ((64, 128), (128, 256)):
        want = analytic[small] / analytic[big]
        assert 0.9 * want <= cycles[small] / cycles[big] <= 1.1 * want, (small, cycles, analytic)


def test_whole_result_buffer_blocks_are_correct() -> None:
    """The teaching chip without double buffering: 64-row blocks fill its whole 64-row result buffer, and the
    next N block overwrites rows after their pop; the result matches the reference interpreter."""
    m = parse_module(dot(64, 40, 24, "bf16", "f32"))
    checked = run_checked(m, random_inputs(m, 3)[0], config="teaching", overrides=["mxu.double_buffered=false"])
    checked.assert_ok("whole-buffer blocks")
    ins = checked.result.compiled.program.streams[0].instructions
    assert {(i.lhs.dims[-2], i.acc) for i in ins if isinstance(i, MxuMatmul)} == {(64, 0)}
    assert sum(isinstance(i, MxuPop) for i in ins) == 3
