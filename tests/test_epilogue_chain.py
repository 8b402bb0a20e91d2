"""Which fusions run as a matmul's epilogue (tpusim/compiler/lowering/epilogue.py): the chain of a bias add
through JAX's reshapes, a residual, and the forms that must stay kernels of their own."""

from __future__ import annotations

import pytest

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.lowering.epilogue import Side, epilogue_chain


def fused(body: str) -> object:
    module = parse_module(f"HloModule m\n\nfused {{\n{body}\n}}\n\nENTRY main {{\n  ROOT c = f32[] constant(0)\n}}\n")
    return module["fused"]


def test_a_bias_through_reshapes_is_a_side_operand_broadcast_along_rows() -> None:
    chain = epilogue_chain(
        fused(
            """  bias = f32[16] parameter(0)
  y = f32[2,8,16] parameter(1)
  r1 = f32[1,1,16] reshape(bias)
  b1 = f32[1,1,16] broadcast(r1), dimensions={0,1,2}
  r2 = f32[16] reshape(b1)
  bb = f32[2,8,16] broadcast(r2), dimensions={2}
  ROOT h = f32[2,8,16] add(y, bb)"""
        ),
        block=1,
    )
    assert chain.block == 1 and chain.sources == (Side(0, (None, None, 0)),)
    assert [(op.fn, op.args) for op in chain.steps] == [("add", (0, 1))]


def test_a_residual_is_a_side_operand_of_the_result_shape() -> None:
    chain = epilogue_chain(
        fused("  y = f32[8,16] parameter(0)\n  res = f32[8,16] parameter(1)\n  ROOT h = f32[8,16] add(res, y)")
    )
    assert chain.sources == (Side(1, (0, 1)),) and [op.args for op in chain.steps] == [(1, 0)]


@pytest.mark.parametrize(
    ("body", "block"),
    [
        (  # two side operands combined before their broadcast: not one window per operand
            """  a = f32[16] parameter(0)
  y = f32[8,16] parameter(1)
  b = f32[16] parameter(2)
  s = f32[16] add(a, b)
  bb = f32[8,16] broadcast(s), dimensions={1}
  ROOT h = f32[8,16] add(y, bb)""",
            1,
        ),
        (  # a reshape that moves elements of a side operand
            """  a = f32[4,4] parameter(0)
  y = f32[8,16] parameter(1)
  r = f32[16] reshape(a)
  bb = f32[8,16] broadcast(r), dimensions={1}
  ROOT h = f32[8,16] add(y, bb)""",
            1,
        ),
        (  # the block reshaped: not elementwise on the result's blocks
            """  y = f32[8,16] parameter(0)
  r = f32[16,8] reshape(y)
  ROOT h = f32[16,8] negate(r)""",
            0,
        ),
    ],
    ids=["sides_combined", "side_relaid_out", "block_reshaped"],
)
def test_other_fusions_stay_kernels_of_their_own(body: str, block: int) -> None:
    with pytest.raises(ValueError):
        epilogue_chain(fused(body), block=block)


def test_a_relayout_counts_as_its_value() -> None:
    """XLA:TPU's dequantisation relayouts the int8 weights inside the fusion (a nested ``copy_fusion`` from
    tiles of 32 rows to 8); a chain works on values, so the copy is its operand's value."""
    module = parse_module(
        """HloModule m

copy_fusion {
  input = s8[64,128]{1,0:T(32,128)(4,1)} parameter(0)
  ROOT copy = s8[64,128]{1,0:T(8,128)(4,1)} copy(input)
}

fused {
  w = s8[64,128]{1,0:T(32,128)(4,1)} parameter(0)
  s = bf16[128] parameter(1)
  f = s8[64,128]{1,0:T(8,128)(4,1)} fusion(w), kind=kLoop, calls=copy_fusion
  c = bf16[64,128] convert(f)
  sb = bf16[64,128] broadcast(s), dimensions={1}
  ROOT d = bf16[64,128] multiply(c, sb)
}

ENTRY main {
  ROOT z = f32[] constant(0)
}
"""
    )
    chain = epilogue_chain(module["fused"], 0, module)
    assert chain.sources == (Side(1, (None, 0)),)
    assert [(op.fn, op.args) for op in chain.steps] == [("convert", (0,)), ("multiply", (2, 1))]
    with pytest.raises(ValueError):  # without the module the nested fusion is unknown
        epilogue_chain(module["fused"], 0)
