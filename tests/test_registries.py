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


def test_the_op_groups_and_the_registries_agree() -> None:
    from tpusim.compiler.hlo.opcodes import ELEMENTWISE, OPCODES
    from tpusim.compiler.hlo.shape_rules import SHAPE_RULES
    from tpusim.compiler.lowering.registry import LOWERINGS, SPECIALISED

    assert set(KERNELS) >= ELEMENTWISE  # every elementwise opcode has a kernel
    assert set(REFERENCE) <= set(OPCODES)
    # Every opcode the reference runs has a shape rule, except custom-call, whose result the text declares.
    assert set(REFERENCE) - set(SHAPE_RULES) == {"custom-call"}
    # Every lowered opcode can also run as a fallback (a lowering may decline an instance).
    assert set(LOWERINGS) | set(SPECIALISED) <= set(REFERENCE)
