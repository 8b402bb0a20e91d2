"""Helpers of the heavy-op reference tests (dot, conv, reduce, gather/scatter, sort, linalg, fft, rng, ...).

:func:`check_hlo` runs HLO text on the reference and on XLA CPU and compares them, for modules JAX's API
cannot express (a batch_group_count convolution, a non-commutative scatter, an odd comparator). The
tolerance rows of the heavy ops live in the one table, :data:`jax_oracle.TOLERANCES`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax_oracle import Tolerance, assert_close, module_tolerance, run_hlo_on_xla

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.memory import element_type_of_dtype

__all__ = ["check_hlo", "reference_of_text"]


def reference_of_text(text: str, *args: Any) -> list[np.ndarray]:
    """Parse HLO ``text`` and run it on the reference."""
    return evaluate(parse_module(text), [np.asarray(a) for a in args])


def check_hlo(text: str, *args: Any, tol: Tolerance | None = None) -> list[np.ndarray]:
    """Run HLO ``text`` on the reference and on XLA CPU; compare every output (module tolerance by default).

    Returns:
        The reference outputs.
    """
    module = parse_module(text)
    got = evaluate(module, [np.asarray(a) for a in args])
    want = run_hlo_on_xla(text, *args)
    assert len(got) == len(want), f"reference gives {len(got)} outputs, XLA {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        t = tol if tol is not None else module_tolerance(module, element_type_of_dtype(w.dtype).name)
        assert_close(g, w, t, f"output {i}")
    return got
