"""What a user may choose about compilation, read by the passes, layout and buffer assignment and lowering."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from tpusim.compiler.errors import CompileError

__all__ = ["CompileOptions"]


@dataclass(frozen=True, kw_only=True)
class CompileOptions:
    """Choices a user can make about compilation.

    Attributes:
        tiling: the tiling rule set (a name in ``configs/tiling/`` or a path).
        matmul_precision: what an HLO ``DEFAULT`` precision means for f32 dots and convolutions:
            ``default`` one bf16 pass, ``high`` three, ``highest`` six (JAX's ``jax_default_matmul_precision``).
        fuse: group chains of elementwise operations into fusions before lowering (as XLA does).
        vmem_fraction: the share of the VMEM left by resident buffers that one HLO instruction may use (the
            rest lets the next one start).
        resident_vmem_fraction: the share of VMEM that buffers resident between instructions (values whose
            layout says ``S(1)``) may take; the rest holds each instruction's own blocks (XLA:TPU's split
            between memory-space assignment and its per-instruction "scoped" VMEM). Residents that do not fit
            move to HBM, the largest first.
        megacore: on a chip of several TensorCores (``core.count``, v4 and v5p), split the blocks of dots
            and vector operations between its cores, one instruction stream per core, as XLA does for
            megacore; False runs everything on core 0 (single-core chips are unaffected either way).
        async_collectives: in a module without async collectives (JAX's), turn the entry computation's
            all-reduces and all-gathers into start/done pairs scheduled around the compute that does not
            depend on them, as XLA:TPU does (:mod:`tpusim.compiler.collective_schedule`); False runs each
            where the module puts it, all of its time exposed.
    """

    tiling: str = "tpu_default"
    matmul_precision: str = "default"
    fuse: bool = True
    vmem_fraction: float = 0.5
    resident_vmem_fraction: float = 0.75
    megacore: bool = True
    async_collectives: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # (a YAML "maybe" or a 1 is not a switch)
            value = getattr(self, f.name)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise CompileError(f"{f.name} must be true or false, not {value!r}")
        if not isinstance(self.tiling, (str, os.PathLike)) or not str(self.tiling):
            raise CompileError(f"tiling must be a rule set's name or a path, not {self.tiling!r}")
        if self.matmul_precision not in ("default", "high", "highest"):
            raise CompileError(f"matmul precision must be default, high or highest, not {self.matmul_precision!r}")
        if not 0.0 < self.vmem_fraction <= 1.0:
            raise CompileError(f"vmem_fraction must be in (0, 1], not {self.vmem_fraction}")
        if not 0.0 <= self.resident_vmem_fraction < 1.0:
            raise CompileError(f"resident_vmem_fraction must be in [0, 1), not {self.resident_vmem_fraction}")
