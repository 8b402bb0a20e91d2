"""DMA copies by contiguous byte runs (TransferPlan.byte_runs) move exactly the bytes the element maps move,
for every layout pair, window and element type tried here; and memories placed side by side stay apart."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tpusim.config import load_config
from tpusim.devices import Chip, stores
from tpusim.devices.dma import transfer_plan
from tpusim.isa import DmaStart, MemRef, Program, Reg, ScalarAlu, SemWait, Space, Symbol, Window
from tpusim.memory import parse_shape

TEACH = load_config("teaching")

LAYOUTS = {
    "f32": ["{1,0}", "{0,1}", "{1,0:T(8,8)}", "{0,1:T(8,8)}", "{1,0:T(4,8)}"],
    "bf16": ["{1,0}", "{1,0:T(8,8)(2,1)}", "{0,1:T(8,8)(2,1)}"],
    "s8": ["{1,0}", "{1,0:T(8,8)(4,1)}"],
}
DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "s8": np.int8}


def ref(space: str, address: int, shape: str, window: Window | None = None) -> MemRef:
    return MemRef(Space(space), address, parse_shape(shape), window)


@pytest.mark.parametrize("et", sorted(LAYOUTS))
def test_windows_between_layouts_move_exactly(et):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((32, 24)) * 50).astype(DTYPES[et])
    for src_layout in LAYOUTS[et]:
        for dst_layout in LAYOUTS[et]:
            src = f"{et}[32,24]{src_layout}"
            dst = f"{et}[16,16]{dst_layout}"
            back = f"{et}[32,24]{dst_layout}"
            syms = [
                Symbol("x", ref("hbm", 0, src)),
                Symbol("t", ref("vmem", 0, dst)),
                Symbol("b", ref("hbm", 0x4000, back)),
            ]
            prog = Program.single(
                [
                    ScalarAlu("mov", Reg(1), 8),
                    DmaStart(ref("hbm", 0, src, Window((Reg(1), 3), (16, 16))), syms[1].ref, sem=0),
                    SemWait(0),
                    DmaStart(syms[1].ref, ref("hbm", 0x4000, back, Window((16, 8), (16, 16))), sem=0),
                    SemWait(0),
                ],
                symbols=syms,
            )
            res = Chip(TEACH).run(prog, {"x": x})
            np.testing.assert_array_equal(res.read("t"), x[8:24, 3:19], err_msg=f"{src} -> {dst}")
            got = res.read("b")
            np.testing.assert_array_equal(got[16:32, 8:24], x[8:24, 3:19], err_msg=f"{dst} -> {back}")
            assert not got[:16].any() and not got[:, :8].any()


def test_tile_aligned_windows_copy_as_strided_runs():
    """A 128 x 128 bf16 block of a 2048 x 2048 tiled array: 16 runs of 2 KiB, 32 KiB apart (one strided copy)."""
    big = parse_shape("bf16[2048,2048]{1,0:T(8,128)(2,1)}")
    block = parse_shape("bf16[128,128]{1,0:T(8,128)(2,1)}")
    plan = transfer_plan(big, (0, 0), block, None, (128, 128))
    assert plan.runs == 16
    assert plan.byte_runs is not None and plan.byte_runs[0] == "strided"
    assert plan.byte_runs[4:] == (0, 0, 16, 2048, 32768, 2048)
    # a transposing copy: every element is its own run, not evenly spaced on the source side
    odd = transfer_plan(parse_shape("f32[24,24]{1,0}"), (0, 0), parse_shape("f32[24,24]{0,1}"), (0, 0), (3, 5))
    assert odd.runs == 15 and odd.byte_runs is not None
    assert odd.byte_runs[0] == "runs" and len(odd.byte_runs[4]) == 15


def test_copies_within_one_memory_and_shifted_windows():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    shape = "f32[64,16]{1,0:T(8,8)}"
    syms = [Symbol("x", ref("vmem", 0, shape)), Symbol("y", ref("vmem", 0x2000, shape))]
    ins = [ScalarAlu("mov", Reg(1), 0)]
    for _ in range(4):  # windows moved by whole tiles: the plan of offset (0, 0), shifted
        ins += [
            DmaStart(
                ref("vmem", 0, shape, Window((Reg(1), 8), (16, 8))),
                ref("vmem", 0x2000, shape, Window((Reg(1), 0), (16, 8))),
                sem=0,
            ),
            SemWait(0),
            ScalarAlu("add", Reg(1), Reg(1), 16),
        ]
    res = Chip(TEACH).run(Program.single(ins, symbols=syms), {"x": x})
    y = res.read("y")
    np.testing.assert_array_equal(y[:, :8], x[:, 8:])
    assert not y[:, 8:].any()


def test_arrays_placed_side_by_side_are_separate_segments(monkeypatch):
    monkeypatch.setattr(stores, "WHOLE_BYTES", 0)  # (the teaching chip's 1 MiB HBM would be one segment)
    data = [np.full((256, 256), k, np.float32) for k in range(3)]
    n = 256 * 256 * 4
    syms = [Symbol(f"a{k}", ref("hbm", k * n, "f32[256,256]{1,0}")) for k in range(3)]
    res = Chip(TEACH).run(Program.single([], symbols=syms), {s.name: d for s, d in zip(syms, data)})
    hbm = res.memory("hbm")
    assert len(hbm.segments) == 3 and hbm.touched == 3 * n  # no merging, no copying, no slack
    for k in range(3):
        np.testing.assert_array_equal(res.read(f"a{k}"), data[k])
    both = hbm.read(n - 8, 16)  # a read across two of them merges them, contents intact
    assert np.array_equal(both[:8].view(np.float32), [0, 0]) and np.array_equal(both[8:].view(np.float32), [1, 1])


def test_a_small_memory_is_one_segment_of_its_capacity():
    """VMEM-sized memories are one zeroed segment from the first touch: far-apart buffers never merge."""
    store = stores.ByteStore("vmem", 1 << 20)
    assert store.segments == [] and not store.read(0x8000, 4).any()  # untouched reads as zeros
    store.write(0xF0000, np.arange(8, dtype=np.uint8))
    store.write(0x100, np.full(4, 7, np.uint8))
    assert len(store.segments) == 1 and store.bases == [0] and store.touched == 1 << 20
    assert store.read(0xF0000, 8).tolist() == list(range(8)) and store.read(0xFE, 6).tolist() == [0, 0, 7, 7, 7, 7]
    with pytest.raises(stores.MemoryAccessError, match="outside vmem"):
        store.view((1 << 20) - 4, 8)
