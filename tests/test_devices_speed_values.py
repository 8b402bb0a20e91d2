"""The decoded-value cache of a memory (tpusim/devices/values.py): values are read-only snapshots, forgotten
when a write overlaps their bytes, and bounded in size."""

from __future__ import annotations

import numpy as np
import pytest

from tpusim.devices import stores, values
from tpusim.devices.stores import ByteStore, write_value
from tpusim.memory import pack, parse_shape
from tpusim.memory.windows import window_extent

SHAPE = parse_shape("f32[16,16]{1,0:T(8,8)}")


def cached(store: ByteStore, address: int, offsets=None, sizes=None):
    lo, hi = window_extent(SHAPE, offsets, sizes)
    return store.cached(address, SHAPE, offsets, sizes, address + lo, address + hi)


def test_values_are_snapshots_until_a_write_overlaps():
    store = ByteStore("vmem", 1 << 20)
    x = np.arange(256, dtype=np.float32).reshape(16, 16)
    store.write(0, pack(x, SHAPE))
    store.write(0x1000, pack(-x, SHAPE))
    a, b = cached(store, 0), cached(store, 0x1000)
    assert cached(store, 0) is a  # decoded once
    np.testing.assert_array_equal(a.value, x)
    with pytest.raises(ValueError):
        a.value[0, 0] = 1  # read-only: holders keep what they read
    f = a.form("f64", lambda v: v.astype(np.float64))
    assert a.form("f64", lambda v: 1 / 0) is f  # derived once
    # a window write into the second array forgets it, not the first
    write_value(store, 0x1000, SHAPE, (8, 8), (8, 8), np.zeros((8, 8), np.float32))
    assert cached(store, 0) is a
    b2 = cached(store, 0x1000)
    assert b2 is not b and not b2.value[8:, 8:].any()
    np.testing.assert_array_equal(b.value, -x)  # the old snapshot is unchanged
    # a plain write over the first one's bytes
    store.write(0x10, np.zeros(4, np.uint8))
    assert cached(store, 0) is not a
    # a window of the array is its own entry
    w = cached(store, 0x1000, (0, 0), (8, 8))
    np.testing.assert_array_equal(w.value, -x[:8, :8])


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(values, "_LIMIT_BYTES", 3 * 1024)  # three 16x16 f32 values
    store = ByteStore("vmem", 1 << 20)
    for k in range(6):
        store.write(0x1000 * k, pack(np.full((16, 16), k, np.float32), SHAPE))
    entries = [cached(store, 0x1000 * k) for k in range(6)]
    vc = store.values
    assert vc is not None and len(vc.entries) == 3 and vc.nbytes == 3 * 1024
    assert list(vc.entries.values()) == entries[3:]  # the least recently used went first
    assert all(int(e.value[0, 0]) == k for k, e in enumerate(entries))
    assert cached(store, 0x5000) is entries[5]
    assert cached(store, 0) is not entries[0] and int(cached(store, 0).value[0, 0]) == 0
    vc.invalidate(0, 1 << 20)
    assert not vc.entries and not vc.pages and vc.nbytes == 0


def test_reads_never_alias_memory(monkeypatch):
    # a row-major window can be a view of the bytes: the cache copies it
    shape = parse_shape("f32[4,4]{1,0}")
    store = ByteStore("vmem", 1 << 16)
    store.write(0, pack(np.ones((4, 4), np.float32), shape))
    monkeypatch.setattr(stores, "unpack", lambda buf, s: buf.view(np.float32).reshape(4, 4))
    e = store.cached(0, shape, None, None, 0, 64)
    assert not np.may_share_memory(e.value, store.view(0, 64))


def test_a_finished_run_keeps_its_memories_not_its_scratch():
    """A result keeps the final memories (``RunResult.memory``/``read``), not the values decoded for the MXU
    or the result buffer's joined operands: those were several times the operands' size."""
    import gc
    import tracemalloc

    import ml_dtypes

    import tpusim
    from tpusim.compiler.hlo import parse_module
    from tpusim.compiler.pipeline import compile_module
    from tpusim.config import load_config

    text = """HloModule mm
ENTRY e {
  a = bf16[512,512] parameter(0)
  b = bf16[512,512] parameter(1)
  ROOT d = bf16[512,512] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    compiled = compile_module(parse_module(text), load_config("tpu_v5e", overrides=["mxu.count=1"]))
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((512, 512)).astype(ml_dtypes.bfloat16) for _ in range(2))
    tpusim.simulate(compiled, [a, b])  # a first run fills the process's caches (decoded streams, windows)
    gc.collect()
    tracemalloc.start()
    try:
        result = tpusim.simulate(compiled, [a, b])
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    run = result.run
    stores = [run.memory("hbm"), run.memory("vmem"), run.memory("smem")]
    held = sum(s.touched for s in stores) + sum(o.nbytes for o in result.outputs)
    assert all(s.values is None for s in stores)
    # the memories and outputs, plus the trace and bookkeeping (a few hundred KiB here)
    assert retained < held + (1 << 20), (retained, held)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(run.read("out0"), result.outputs[0])
    assert np.max(np.abs(result.outputs[0].astype(np.float32) - want.astype(np.float32))) <= 2**-7 * np.max(
        np.abs(want.astype(np.float32))
    )
