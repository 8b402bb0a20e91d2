"""XLA's CPU backend as an oracle for HLO text that JAX does not emit itself.

JAX on CPU lowers some ops to other things (cholesky and triangular_solve to LAPACK custom calls, for
instance), and some semantics only show with hand-written HLO (a non-commutative scatter combiner, a
batch_group_count convolution, an odd comparator). :func:`run_hlo` compiles HLO *text* with the XLA CPU
backend JAX ships (text -> HloModule -> StableHLO -> PJRT compile) and runs it, so such modules are
checked against XLA itself rather than against our reading of the documentation.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax._src.lib import _jax, xla_client

__all__ = ["run_hlo"]


def run_hlo(text: str, *args: Any) -> list[np.ndarray]:
    """Compile the HLO module ``text`` for XLA CPU, run it on ``args`` and return its outputs, flattened."""
    module = xla_client.hlo.hlo_module_from_text(text)
    stablehlo = _jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    backend = jax.extend.backend.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(stablehlo, xla_client.DeviceList((device,)), xla_client.CompileOptions())
    outs = exe.execute([jax.device_put(np.asarray(a), device) for a in args])
    return [np.asarray(o) for o in jax.tree_util.tree_leaves(outs)]
