"""What the ``make_xla_*.py`` scripts share: compile JAX programs with XLA:TPU (offline, with libtpu) and store
each compiled module with its inputs and JAX's outputs as test data that needs no libtpu.

Per program, in ``out/<name>/``: ``<chip>.hlo.gz`` (XLA's compiled module, gzipped without a timestamp) and
``data.npz`` (``in<i>``: the inputs, ``out<j>``: JAX's outputs on the CPU; bf16 arrays as their exact f32
values, since ``.npz`` has no bf16); optionally ``<chip>.json`` with XLA's time estimate.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

Program = tuple[Callable[..., object], Sequence[np.ndarray], Callable[[str], bool] | None]
"""(JAX function, inputs, whether a compiled module has the form the program is kept for; None: any)."""


def stored(a: np.ndarray) -> np.ndarray:
    """``a`` as ``.npz`` can hold it (bf16 as its exact f32 values)."""
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def write_programs(
    out: Path, programs: Mapping[str, Program], chips: Mapping[str, str], missing: str, estimates: bool = False
) -> int:
    """Compile and store every program for every chip (``{"v5e": "tpu_v5e"}``: file name -> tpusim config);
    1, with a message naming the program and ``missing``, when a compiled module lacks its form. With
    ``estimates``, also ``<chip>.json``: XLA's ``optimal_seconds`` for the module (ConcatBitcast-corrected)."""
    import jax

    from tpusim.xla_tpu import compile_with_xla

    for name, (fn, inputs, has_form) in programs.items():
        text = jax.jit(fn).lower(*inputs).as_text(dialect="hlo")
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        for chip, config in chips.items():
            result = compile_with_xla(text, config)
            compiled = result.text
            if has_form is not None and not has_form(compiled):
                print(f"{name}: XLA:TPU's {chip} module {missing} (another libtpu?)", file=sys.stderr)
                return 1
            (folder / f"{chip}.hlo.gz").write_bytes(gzip.compress(compiled.encode(), mtime=0))
            if estimates:
                facts = {"optimal_seconds": result.optimal_seconds}
                (folder / f"{chip}.json").write_text(json.dumps(facts, indent=1) + "\n")
        outs = jax.jit(fn)(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        arrays = {f"in{i}": stored(np.asarray(a)) for i, a in enumerate(inputs)}
        arrays |= {f"out{j}": stored(np.asarray(o)) for j, o in enumerate(outs)}
        np.savez_compressed(folder / "data.npz", **arrays)  # type: ignore[arg-type]
    print(f"wrote {out}")
    return 0
