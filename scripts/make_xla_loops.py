"""Generate ``tests/data/xla_loops/``: a ``fori_loop`` whose XLA:TPU compilation (v5e) carries an input through
the loop unchanged in HBM and reads one window of it per iteration with a ``dynamic-slice`` inside a fusion,
with its input and JAX's output.

    python scripts/make_xla_loops.py   # needs libtpu (pip install 'jax[tpu]')

Program (the script fails if XLA no longer writes that form):

* ``dslice_fori_f32``: ``fori_loop`` over 16 iterations adding ``x[32*i : 32*i+32]`` of f32[512,256] into an
  accumulator (small integer inputs: the sums are exact).

Files: ``v5e.hlo.gz`` (XLA's compiled module) and ``data.npz`` (``in0``, ``out0``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
from xla_test_data import write_programs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "xla_loops"


def dslice_loop(x: object) -> object:
    import jax.numpy as jnp
    from jax import lax

    def body(i: object, acc: object) -> object:
        return acc + lax.dynamic_slice_in_dim(x, i * 32, 32, 0)  # type: ignore[operator]

    return lax.fori_loop(0, 16, body, jnp.zeros((32, 256), jnp.float32))


def fused_dynamic_slice_of_hbm(text: str) -> bool:
    """Whether a fused computation takes the f32[512,256] array from HBM (no ``S(1)``) into a dynamic-slice."""
    return re.search(r"f32\[512,256\]\{1,0:T\(8,128\)\} parameter", text) is not None and "dynamic-slice(" in text


def main() -> int:
    x = np.random.default_rng(0).integers(-4, 5, size=(512, 256)).astype(np.float32)
    programs = {"dslice_fori_f32": (dslice_loop, [x], fused_dynamic_slice_of_hbm)}
    return write_programs(OUT, programs, {"v5e": "tpu_v5e"}, "reads no window of an HBM input in a fusion")


if __name__ == "__main__":
    sys.exit(main())
