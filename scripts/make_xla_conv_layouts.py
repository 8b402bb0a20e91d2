"""Generate ``tests/data/xla_conv_layouts/``: NHWC convolutions whose XLA:TPU compilation (v5e and v6e) stores
the activations ``{3,0,2,1}`` (physical ``[H, W, N, C]``: the batch in the sublanes of each ``(8,128)`` tile,
below the spatial dimensions), with their inputs, JAX's outputs and XLA's time estimates.

    python scripts/make_xla_conv_layouts.py   # needs libtpu (pip install 'jax[tpu]')

Programs (the script fails if XLA no longer lays out a convolution's input that way):

* ``conv3x3_bf16``: a 3x3 SAME convolution of bf16[8,8,8,64] by [3,3,64,64].
* ``conv3x3_stride2_bf16``: a 3x3 convolution with stride 2 of bf16[8,16,16,32] by [3,3,32,64].

The inputs are small integers, so every bf16 product and f32 sum is exact and the files stay small.

Files per program: ``v5e.hlo.gz``, ``v6e.hlo.gz`` (XLA's compiled modules), ``v5e.json``, ``v6e.json`` (XLA's
``optimal_seconds``) and ``data.npz`` (``in<i>``: the inputs as f32, ``out<j>``: JAX's outputs as f32).
Kept for their time only (modules and estimates, no data), in ``timing/``:

* ``conv3x3_56x56_bf16``: a 3x3 SAME convolution of bf16[8,56,56,64] by [3,3,64,64] (a ResNet stage's size).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
from xla_test_data import write_programs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "xla_conv_layouts"
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}


def _integers(shape: tuple[int, ...], seed: int) -> np.ndarray:
    import jax.numpy as jnp

    return np.random.default_rng(seed).integers(-3, 4, size=shape).astype(jnp.bfloat16)


def programs() -> dict[str, tuple[Callable[..., object], list[np.ndarray]]]:
    """name -> (JAX function, inputs)."""
    from jax import lax

    def conv(stride: int) -> Callable[..., object]:
        def fn(x: object, w: object) -> object:
            return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

        return fn

    return {
        "conv3x3_bf16": (conv(1), [_integers((8, 8, 8, 64), 0), _integers((3, 3, 64, 64), 1)]),
        "conv3x3_stride2_bf16": (conv(2), [_integers((8, 16, 16, 32), 2), _integers((3, 3, 32, 64), 3)]),
    }


def has_batch_in_sublanes(text: str) -> bool:
    """Whether some convolution's input is laid out ``{3,0,2,1...}``."""
    shapes = dict(re.findall(r"%(\S+) = \w+\[[\d,]+\]\{([\d,]+)", text))
    for line in text.splitlines():
        call = re.search(r"convolution\(%([^,\s]+),", line)
        if call and shapes.get(call.group(1)) == "3,0,2,1":
            return True
    return False


def timed() -> dict[str, tuple[Callable[..., object], list[tuple[int, ...]]]]:
    """name -> (JAX function, bf16 argument shapes): programs kept for their time only (no data)."""
    from jax import lax

    def conv(x: object, w: object) -> object:
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    return {"conv3x3_56x56_bf16": (conv, [(8, 56, 56, 64), (3, 3, 64, 64)])}


def main() -> int:
    import gzip
    import json

    import jax
    import jax.numpy as jnp

    from tpusim.xla_tpu import compile_with_xla

    found = {name: (fn, inputs, has_batch_in_sublanes) for name, (fn, inputs) in programs().items()}
    if write_programs(OUT, found, CHIPS, "has no convolution with the batch in sublanes", estimates=True):
        return 1
    for name, (fn, shapes) in timed().items():
        specs = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
        text = jax.jit(fn).lower(*specs).as_text(dialect="hlo")
        folder = OUT / "timing" / name
        folder.mkdir(parents=True, exist_ok=True)
        for chip, config in CHIPS.items():
            compiled = compile_with_xla(text, config)
            if not has_batch_in_sublanes(compiled.text):
                print(f"{name}: XLA:TPU's {chip} module has no convolution with the batch in sublanes", file=sys.stderr)
                return 1
            (folder / f"{chip}.hlo.gz").write_bytes(gzip.compress(compiled.text.encode(), mtime=0))
            facts = {"optimal_seconds": compiled.optimal_seconds}
            (folder / f"{chip}.json").write_text(json.dumps(facts, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
