"""Generate ``tests/data/xla_mixed_precision/``: JAX programs whose XLA:TPU compilation (v5e and v6e) has
instructions whose declared floating-point type differs from the one their operands give (XLA's
``allow_mixed_precision``), with seeded inputs and JAX's outputs.

    python scripts/make_xla_mixed_precision.py   # needs libtpu (pip install 'jax[tpu]')

Programs and the form each one's compiled module must have (the script fails if XLA no longer writes it):

* ``softmax_bf16_logits``: softmax in f32 over bf16 logits; a fused ``f32 broadcast(bf16)`` of the row maximum.
* ``argmin``: ``jnp.argmin`` of f32 rows; a variadic ``(bf16, s32) reduce`` whose reducer computes in f32.
* ``pad_f32_value``: bf16 values padded with 0.1 after ``astype(float32)``; ``f32 pad(bf16, f32 0.1)``.
* ``sort_f32_of_bf16``: ``jnp.sort(x.astype(float32))`` of bf16 rows; ``(f32, s32) sort(bf16, s32 iota)``
  whose comparator takes f32 (XLA folded the convert into the sort).

Files per program: ``v5e.hlo.gz``, ``v6e.hlo.gz`` (XLA's compiled modules) and ``data.npz`` (``in<i>``: the
inputs, bf16 ones as their exact f32 values since ``.npz`` has no bf16; ``out<j>``: JAX's outputs on the CPU).
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
OUT = ROOT / "tests" / "data" / "xla_mixed_precision"
SEED = 0
SHAPE = (16, 256)
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}


def programs() -> dict[str, tuple[Callable[..., object], list[np.ndarray], Callable[[str], bool]]]:
    """name -> (JAX function, inputs, whether a compiled module has the program's mixed-precision form)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(SEED)
    logits = rng.standard_normal(SHAPE).astype(jnp.bfloat16)
    rows = rng.standard_normal(SHAPE).astype(np.float32)
    values = rng.standard_normal(SHAPE).astype(jnp.bfloat16)
    keys = rng.standard_normal(SHAPE).astype(jnp.bfloat16)
    return {
        "softmax_bf16_logits": (
            lambda x: jax.nn.softmax(x.astype(jnp.float32), axis=-1),
            [logits],
            _mixed_broadcast,
        ),
        "argmin": (
            lambda x: jnp.argmin(x, axis=-1),
            [rows],
            lambda text: re.search(r"= \(bf16\[16\]\{[^}]*\}, s32\[16\]\{[^}]*\}\) reduce\(", text) is not None,
        ),
        "pad_f32_value": (
            lambda x: jnp.pad(x.astype(jnp.float32), ((1, 1), (0, 3)), constant_values=0.1),
            [values],
            lambda text: re.search(r"= f32\[18,259\]\{[^}]*\} pad\(%x", text) is not None,  # (x is bf16)
        ),
        "sort_f32_of_bf16": (
            lambda x: jnp.sort(x.astype(jnp.float32), axis=-1),
            [keys],
            _mixed_sort,
        ),
    }


def _mixed_broadcast(text: str) -> bool:
    """Whether some ``f32 broadcast`` reads a bf16 value (the operand's type is in its definition)."""
    types = dict(re.findall(r"%(\S+) = (\w+)\[", text))
    return any(types.get(o) == "bf16" for o in re.findall(r"= f32\[[^\]]*\]\{[^}]*\} broadcast\(%([^),]+)\)", text))


def _mixed_sort(text: str) -> bool:
    """Whether some sort with an f32 first result sorts a bf16 first operand."""
    types = dict(re.findall(r"%(\S+) = (\w+)\[", text))
    return any(types.get(o) == "bf16" for o in re.findall(r"= \(f32\[[^\]]*\]\{[^}]*\}, [^=]*\) sort\(%([^),]+)", text))


def main() -> int:
    return write_programs(OUT, programs(), CHIPS, "lacks the mixed-precision form")


if __name__ == "__main__":
    sys.exit(main())
