"""The per-opcode registries agree with one another: what the vector unit can compute has a kernel, and every
kernel is what the reference interpreter computes with."""

from tpusim.compiler.hlo.reference import ELEMENTWISE, REFERENCE
from tpusim.compiler.hlo.reference.elementwise import TUPLES_TOO
from tpusim.isa import VPU_FUNCTIONS
from tpusim.semantics.elementwise import KERNELS, NOT_ELEMENTWISE


def test_every_vector_function_has_a_kernel() -> None:
    assert set(VPU_FUNCTIONS) <= set(KERNELS)


def test_the_reference_computes_every_kernel_op_with_the_kernel() -> None:
    for op in KERNELS:
        assert op in REFERENCE, op
        if op not in TUPLES_TOO:
            assert REFERENCE[op].__qualname__.startswith("_reference"), op
            assert (op in ELEMENTWISE) == (op not in NOT_ELEMENTWISE), op
