"""XLA:TPU's loops carry inputs through their state and read windows of them: a ``fori_loop`` adding
``x[32*i : 32*i+32]`` of f32[512,256] keeps ``x`` in the loop state, in HBM, unchanged, and its body's fusion
takes the whole array into a ``dynamic-slice``. tpusim copied the array into a fresh state buffer before the
loop and loaded all of it into VMEM in every iteration (16 times the array, 21.0 us); it now shares the
buffer of a state element the body passes on unchanged, and loads only the window a fused dynamic-slice of
an input reads (9.7 us). The accumulator starts as XLA's ``AllocateBuffer`` (undefined bytes, discarded by a
select in the first iteration): filled with zeros in VMEM, as the reference gives it, so that the program
verifier accepts the read.

XLA's module is stored in ``tests/data/xla_loops/`` (``scripts/make_xla_loops.py``) with its input and JAX's
output, so the test needs no libtpu.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

import tpusim
from tpusim.compiler.hlo import parse_module

DATA = Path(__file__).parent / "data" / "xla_loops"


def test_a_loop_reads_only_the_windows_of_the_input_it_carries() -> None:
    """JAX's sums exactly, and the DMAs move at most four times the array's bytes in all (every window in,
    each iteration's sum out of its block and the result; 19 times before)."""
    folder = DATA / "dslice_fori_f32"
    module = parse_module(gzip.decompress((folder / "v5e.hlo.gz").read_bytes()).decode())
    with np.load(folder / "data.npz") as data:
        x, want = data["in0"], data["out0"]
    result = tpusim.simulate(module, [x], config="tpu_v5e")
    assert result.fallbacks == ()
    np.testing.assert_array_equal(np.asarray(result.outputs[0]), want)
    moved = sum(row[4] for row in result.trace.rows() if row[1].endswith(".dma"))
    assert moved <= 4 * x.nbytes, (moved, x.nbytes)
