"""Sweeps: run programs over a grid of chip configs and compile options, in parallel, resumably, and compare.

``tpusim sweep SPEC.yaml`` (or :func:`run_sweep` on :func:`load_spec`); specs are described in
``docs/sweeps.md`` and shipped in ``configs/sweeps/``.
"""

from tpusim.sweep.runner import SweepInterrupted, SweepResult, run_sweep
from tpusim.sweep.spec import Point, SweepError, SweepSpec, load_spec
from tpusim.sweep.store import SweepWarning

__all__ = [
    "Point", "SweepError", "SweepInterrupted", "SweepResult", "SweepSpec", "SweepWarning", "load_spec", "run_sweep",
]  # fmt: skip
