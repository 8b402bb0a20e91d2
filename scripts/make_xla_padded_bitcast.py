"""Generate ``tests/data/xla_padded_bitcast/``: JAX programs whose XLA:TPU compilation (v5e and v6e) bitcasts
an array to another size of the same tiled bytes (``f32[501]{0:T(512)}`` to ``f32[512]{0:T(512)}``: the
operand's padding becomes elements, which the program later slices away; or ``f32[64,256]`` to
``f32[61,256]`` under ``T(8,128)``: the last rows become padding), with inputs whose values tell each
element's origin, and JAX's outputs.

    python scripts/make_xla_padded_bitcast.py   # needs libtpu (pip install 'jax[tpu]')

Programs (the script fails if XLA no longer writes such a bitcast for one of them):

* ``reverse_step2_f32``: ``x[::-2]`` of f32[1001] (a strided slice to f32[501], bitcast to f32[512], reversed).
* ``reverse_2d_f32``: ``x[::-3, ::-2]`` of f32[50,257].
* ``reverse_2d_s8``: ``x[::-3, ::-1]`` of s8[50,257] (int8 tiles ``(8,128)(4,1)``).
* ``roll_f32``, ``roll_bf16``: ``jnp.roll(x, (3, 5), (0, 1))`` of [64,256] (bitcasts that drop rows).
* ``rot90_f32``: ``jnp.rot90`` of f32[30,257].

Files per program: ``v5e.hlo.gz``, ``v6e.hlo.gz`` (XLA's compiled modules) and ``data.npz`` (``in<i>``: the
inputs, bf16 ones as their exact f32 values since ``.npz`` has no bf16; ``out<j>``: JAX's outputs on the CPU,
bf16 ones as f32).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
from xla_test_data import write_programs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "xla_padded_bitcast"
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}


def _distinct(shape: tuple[int, ...], dtype: object, period: int | None = None) -> np.ndarray:
    """Values that tell every element of a moved array where it came from (``0, 1, 2 ...``, modulo ``period``
    for narrow types), small once compressed."""
    values = np.arange(int(np.prod(shape))).reshape(shape)
    return (values % period - period // 2 if period else values).astype(dtype)  # type: ignore[call-overload]


def programs() -> dict[str, tuple[Callable[..., object], list[np.ndarray]]]:
    """name -> (JAX function, inputs)."""
    import jax.numpy as jnp

    def roll(x: object) -> object:
        return jnp.roll(x, (3, 5), (0, 1))

    return {
        "reverse_step2_f32": (lambda x: x[::-2], [_distinct((1001,), np.float32)]),
        "reverse_2d_f32": (lambda x: x[::-3, ::-2], [_distinct((50, 257), np.float32)]),
        "reverse_2d_s8": (lambda x: x[::-3, ::-1], [_distinct((50, 257), np.int8, 256)]),
        "roll_f32": (roll, [_distinct((64, 256), np.float32)]),
        "roll_bf16": (roll, [_distinct((64, 256), jnp.bfloat16, 256)]),
        "rot90_f32": (jnp.rot90, [_distinct((30, 257), np.float32)]),
    }


def has_padded_bitcast(text: str) -> bool:
    """Whether some bitcast of the module changes the number of elements (same tiled bytes)."""
    from tpusim.compiler.hlo import parse_module

    module = parse_module(text, verify=False)
    return any(
        i.opcode == "bitcast" and comp[i.operands[0]].array_shape.element_count != i.array_shape.element_count
        for comp in module.computations
        for i in comp.instructions
    )


def main() -> int:
    found = {name: (fn, inputs, has_padded_bitcast) for name, (fn, inputs) in programs().items()}
    return write_programs(OUT, found, CHIPS, "has no bitcast between sizes")


if __name__ == "__main__":
    sys.exit(main())
