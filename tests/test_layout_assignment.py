"""Layout assignment: rule sets, precedence of the HLO text, aliases, and inserted relayout copies."""

from pathlib import Path

import pytest

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.layout_assignment import assign_layouts
from tpusim.compiler.tiling_rules import load_tiling_rules
from tpusim.config import load_config
from tpusim.errors import ConfigError
from tpusim.memory import Shape, TupleShape, element_type, parse_shape

V5E = load_config("tpu_v5e")
RULES = load_tiling_rules("tpu_default")


def _layout(text: str, rules=RULES) -> str:  # type: ignore[no-untyped-def]
    shape = parse_shape(text)
    assert isinstance(shape, Shape)
    return str(shape.with_layout(rules.layout_for(shape)))


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("f32[256,512]", "f32[256,512]{1,0:T(8,128)}"),
        ("f32[3,512]", "f32[3,512]{1,0:T(4,128)}"),
        ("f32[2,512]", "f32[2,512]{1,0:T(2,128)}"),
        ("bf16[256,512]", "bf16[256,512]{1,0:T(8,128)(2,1)}"),
        ("bf16[1,4096]", "bf16[1,4096]{1,0:T(2,128)(2,1)}"),
        ("s8[64,256]", "s8[64,256]{1,0:T(32,128)(4,1)}"),  # XLA:TPU's int8 weights in the corpus
        ("pred[16,128]", "pred[16,128]{1,0:T(8,128)E(32)}"),
        ("f32[]", "f32[]{:T(128)}"),
        ("bf16[]", "bf16[]{:T(256)}"),
        ("pred[]", "pred[]{:T(512)}"),
        ("f32[100]", "f32[100]{0:T(128)}"),
        ("bf16[4096]", "bf16[4096]{0:T(1024)(128)(2,1)}"),
        # rank 1 as XLA:TPU lays out the corpus's parameters: the smallest power-of-two tile that holds it
        ("f32[256]", "f32[256]{0:T(256)}"),
        ("f32[512]", "f32[512]{0:T(512)}"),
        ("bf16[512]", "bf16[512]{0:T(512)(128)(2,1)}"),
        ("bf16[128]", "bf16[128]{0:T(256)(128)(2,1)}"),
        ("bf16[10]", "bf16[10]{0:T(256)(128)(2,1)}"),
        ("s4[64,128]", "s4[64,128]{1,0:T(8,128)(8,1)E(4)}"),
        ("f32[8,3]{0,1}", "f32[8,3]{0,1:T(4,128)}"),  # physical order (3, 8): the second-minor size is 3
    ],
)
def test_default_tpu_rules(shape: str, expected: str) -> None:
    assert _layout(shape) == expected


def test_rule_sets_are_chip_relative_and_swappable() -> None:
    teaching = load_tiling_rules("tpu_default", sublanes=8, lanes=8)
    assert _layout("bf16[64,64]", teaching) == "bf16[64,64]{1,0:T(8,8)(2,1)}"
    assert _layout("bf16[256,512]", load_tiling_rules("bf16_16x128")) == "bf16[256,512]{1,0:T(16,128)}"
    assert _layout("s8[256,512]", load_tiling_rules("int8_8x128")) == "s8[256,512]{1,0:T(8,128)(4,1)}"
    # A rule set that extends another falls back to its rules.
    assert _layout("f32[256,512]", load_tiling_rules("bf16_16x128")) == "f32[256,512]{1,0:T(8,128)}"


BAD_RULE_FILES = [
    (
        "name: bad\nrules:\n  - {rank: 2, tiles: '(8,128)', colour: red}\n",
        r"bad.yaml:3: unknown key 'colour' in a tiling rule",
    ),
    (
        "name: bad\nrules:\n  - {rank: 'lots', tiles: '(8,128)'}\n",
        r"bad.yaml:3: 'rank: lots' is not a number or a range",
    ),
    (
        "name: bad\nrules:\n  - {tiles: '(8,0)'}\n",
        r"bad.yaml:3: bad tiles '\(8,0\)': a tile size must be a positive integer",
    ),
    ("name: bad\nname: again\nrules: []\n", r"bad.yaml:2: key 'name' is given twice \(first on line 1\)"),
    # found by a helper's CLI sweep: these named no file or line
    (
        "name: bad\nrules:\n  - {tiles: '(8,128)', element_size_bits: 3}\n",
        r"bad.yaml:3: 'element_size_bits' must be 0 .* not 3",
    ),
    ("name: bad\nrules:\n  - {tiles: '()'}\n", r"bad.yaml:3: bad tiles '\(\)': a tile needs at least one dimension"),
    (
        "name: bad\nextends: nope\nrules:\n  - {tiles: '(8,128)'}\n",
        r"bad.yaml:2: extends 'nope': unknown tiling rule set 'nope'",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_RULE_FILES)
def test_bad_rule_files_name_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_tiling_rules(bad)


def test_a_rule_narrower_than_the_type_it_matches_names_its_line_and_the_array(tmp_path: Path) -> None:
    """Found by a campaign of bad inputs: the error named neither the rule file and line nor the array."""
    path = tmp_path / "rules.yaml"
    path.write_text("name: t\nrules:\n  - {tiles: '(8,128)', element_size_bits: 8}\n")
    rules = load_tiling_rules(path)
    assert rules.layout_for(Shape(element_type("s8"), (8, 128))).element_size_bits == 8
    with pytest.raises(ConfigError, match=r"rules.yaml:3.*element_size_bits 8 is narrower than the 32 bits of f32"):
        rules.layout_for(Shape(element_type("f32"), (8, 128)))


def test_a_rule_file_named_without_a_suffix_is_read_as_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tiling ./myrules`` (a file without ``.yaml``) was taken for a shipped rule set's name."""
    (tmp_path / "myrules").write_text("name: mine\nrules:\n  - {tiles: '(8,128)'}\n")
    monkeypatch.chdir(tmp_path)
    assert load_tiling_rules("./myrules").name == "mine"
    assert load_tiling_rules(tmp_path / "myrules").name == "mine"
    assert load_tiling_rules("myrules").name == "mine"  # (no shipped set has that name)
    (tmp_path / "tpu_default").write_text("name: not the shipped one\nrules:\n  - {tiles: '(8,128)'}\n")
    assert load_tiling_rules("tpu_default").name == "tpu_default"  # a shipped name stays the shipped set


def test_unknown_and_cyclic_rule_sets_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown tiling rule set 'nope' \(known: .*tpu_default"):
        load_tiling_rules("nope")
    # found by a helper's CLI sweep: this recursed 64 files deep
    (tmp_path / "a.yaml").write_text("name: a\nextends: b.yaml\nrules:\n  - {tiles: '(8,128)'}\n")
    (tmp_path / "b.yaml").write_text("name: b\nextends: a.yaml\nrules:\n  - {tiles: '(8,128)'}\n")
    with pytest.raises(ConfigError, match=r"a.yaml:2: extends 'b.yaml': .*b.yaml:2: rule set 'b' extends itself"):
        load_tiling_rules(tmp_path / "a.yaml")  # (b.yaml is found beside a.yaml, wherever the run is)


MODULE = """
HloModule m, entry_computation_layout={(f32[16,256]{1,0:T(8,128)}, bf16[16,256]{1,0})->(f32[16,256]{1,0}, s32[])}

body {
  p = (s32[], f32[16,256]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[16,256] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  y = f32[16,256]{0,1:T(8,128)} negate(x)
  ROOT t = (s32[], f32[16,256]) tuple(i2, y)
}

cond {
  p = (s32[], f32[16,256]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  a = f32[16,256] parameter(0)
  b = bf16[16,256]{1,0} parameter(1)
  zero = s32[] constant(0)
  c = f32[16,256] convert(b)
  s = f32[16,256] add(a, c)
  init = (s32[], f32[16,256]) tuple(zero, s)
  w = (s32[], f32[16,256]) while(init), condition=cond, body=body
  r = f32[16,256] get-tuple-element(w), index=1
  k = s32[] get-tuple-element(w), index=0
  ROOT out = (f32[16,256], s32[]) tuple(r, k)
}
"""


def test_every_value_gets_a_layout_and_aliases_agree() -> None:
    result = assign_layouts(parse_module(MODULE), RULES, V5E)
    module = result.module
    for comp in module.computations:
        for instr in comp.instructions:
            leaves = instr.shape.leaves() if isinstance(instr.shape, TupleShape) else [instr.shape]
            for leaf in leaves:
                assert leaf.layout is not None and leaf.layout.tiles, f"{comp.name}/{instr.name}: {leaf}"
    main, body, cond = module["main"], module["body"], module["cond"]
    assert str(main["b"].shape) == "bf16[16,256]{1,0:T(8,128)(2,1)}"  # text gave only minor_to_major
    assert main["w"].shape == main["init"].shape  # the loop state keeps its operand's layout
    assert body["p"].shape == main["init"].shape and cond["p"].shape == main["init"].shape
    assert main["r"].shape == main["w"].shape.elements[1]  # type: ignore[union-attr]


def test_a_body_result_in_another_layout_gets_a_relayout_copy() -> None:
    result = assign_layouts(parse_module(MODULE), RULES, V5E)
    body = result.module["body"]
    # y is written {0,1:T(8,128)} in the text; the loop state is {1,0:T(8,128)}: a copy converts it.
    assert str(body["y"].shape) == "f32[16,256]{0,1:T(8,128)}"
    (relayout,) = result.relayouts
    assert relayout.computation == "body" and relayout.source.startswith("t")
    copy = body[relayout.name]
    assert copy.opcode == "copy" and str(copy.shape) == "f32[16,256]{1,0:T(8,128)}"
    assert body.root_instruction.shape == result.module["main"]["w"].shape


def test_orders_are_chosen_as_xla_tpu_chooses_them_for_a_head_projection() -> None:
    """JAX prints the default order on every shape of a module not yet laid out; like XLA:TPU's layout
    assignment, tpusim chooses the orders. The weight of einsum("bsd,dhk->bshk") is stored with its
    contraction in lanes, the result with the sequence in lanes: no 64-wide dimension in the 128 lanes, and
    the MXU streams whole tiles (XLA:TPU's own choice, tests/data/corpus/einsum_heads_bf16/v5e.hlo.gz:
    w {0,2,1}, result {1,3,2,0})."""
    text = """
HloModule heads
ENTRY main {
  x = bf16[4,256,512]{2,1,0} parameter(0)
  w = bf16[512,8,64]{2,1,0} parameter(1)
  ROOT y = bf16[4,256,8,64]{3,2,1,0} dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}
}
"""
    main = assign_layouts(parse_module(text), RULES, V5E).module["main"]
    assert str(main["x"].shape) == "bf16[4,256,512]{2,1,0:T(8,128)(2,1)}"  # compact as it is: kept
    assert str(main["w"].shape) == "bf16[512,8,64]{0,2,1:T(8,128)(2,1)}"
    assert str(main["y"].shape) == "bf16[4,256,8,64]{1,3,2,0:T(8,128)(2,1)}"


def test_attention_heads_are_stored_without_padding() -> None:
    """flax's attention projects to heads with a [width, heads, head_dim] weight; the per-head values (the
    projections, the scores' operands) take orders with the 128-long sequence in lanes: no 64-wide head
    dimension padded to 128 lanes."""
    text = """
HloModule heads
ENTRY main {
  x = bf16[2,128,256]{2,1,0} parameter(0)
  wq = bf16[256,4,64]{2,1,0} parameter(1)
  wk = bf16[256,4,64]{2,1,0} parameter(2)
  q = bf16[2,128,4,64]{3,2,1,0} dot(x, wq), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  k = bf16[2,128,4,64]{3,2,1,0} dot(x, wk), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  qs = bf16[2,128,4,64]{3,2,1,0} multiply(q, q)
  ROOT s = f32[2,4,128,128]{3,2,1,0} dot(qs, k), lhs_batch_dims={0,2}, rhs_batch_dims={0,2},
      lhs_contracting_dims={3}, rhs_contracting_dims={3}
}
"""
    main = assign_layouts(parse_module(text), RULES, V5E).module["main"]
    for name in ("q", "k", "qs"):
        shape = main[name].array_shape
        assert shape.dimensions[shape.layout.minor_to_major[0]] == 128, shape  # the sequence in lanes
        assert shape.byte_size == 2 * 128 * 4 * 64 * 2, shape  # no padding
    assert main["q"].array_shape.layout == main["qs"].array_shape.layout  # the elementwise op moves nothing


def test_parameters_with_an_order_of_their_own_keep_it_and_tiled_modules_keep_theirs() -> None:
    text = """
HloModule heads
ENTRY main {
  q = bf16[2,128,4,64]{3,2,1,0} parameter(0)
  k = bf16[2,128,4,64]{2,3,1,0} parameter(1)
  qn = bf16[2,128,4,64]{3,2,1,0} negate(q)
  kn = bf16[2,128,4,64]{3,2,1,0} negate(k)
  ROOT s = f32[2,4,128,128]{3,2,1,0} dot(qn, kn), lhs_batch_dims={0,2}, rhs_batch_dims={0,2},
      lhs_contracting_dims={3}, rhs_contracting_dims={3}
}
"""
    main = assign_layouts(parse_module(text), RULES, V5E).module["main"]
    assert main["k"].array_shape.layout.minor_to_major == (2, 3, 1, 0)  # written by the text: kept
    assert main["q"].array_shape.layout.minor_to_major != (3, 2, 1, 0)  # the default: the compiler's to choose
    # A module with tiles has been laid out already: its orders are kept.
    tiled = text.replace("{3,2,1,0} negate", "{3,2,1,0:T(4,128)(2,1)} negate")
    kept = assign_layouts(parse_module(tiled), RULES, V5E).module["main"]
    assert str(kept["qn"].shape) == "bf16[2,128,4,64]{3,2,1,0:T(4,128)(2,1)}"


def test_an_optimization_barrier_keeps_its_operands_layouts() -> None:
    """``opt-barrier`` emits no code: its result is its operand's bytes, so it must have the operand's
    layouts. It took default layouts, so a tall, narrow weight laid out column-major (``{0,1}``) was read
    row-major after the barrier: every ``jax.checkpoint`` / ``nn.remat`` gradient came out wrong."""
    text = """HloModule barrier
ENTRY main {
  w = f32[256,64]{0,1} parameter(0)
  x = f32[64,64] parameter(1)
  t = (f32[256,64]{0,1}, f32[64,64]) tuple(w, x)
  b = (f32[256,64], f32[64,64]) opt-barrier(t)
  ROOT g = f32[256,64] get-tuple-element(b), index=0
}
"""
    module = assign_layouts(parse_module(text), RULES, V5E).module
    main = module["main"]
    assert main["b"].shape == main["t"].shape


def test_remat_gradients_equal_jaxs() -> None:
    """The same through JAX: a gradient through ``jax.checkpoint`` (its backward pass holds a tuple
    barrier), f32 products at full precision: 1.2 relative error before."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tpusim
    from tpusim.compiler.options import CompileOptions

    rng = np.random.default_rng(0)
    w1, w2, x = (rng.standard_normal(s).astype(np.float32) / 8 for s in ((64, 256), (256, 64), (64, 64)))
    block = jax.checkpoint(lambda w1, w2, x: (x @ w1) @ w2)

    def grad(w1, w2, x):  # type: ignore[no-untyped-def]
        return jax.grad(lambda w1: jnp.sum(block(w1, w2, x)))(w1)

    got = tpusim.simulate_jax(grad, w1, w2, x, options=CompileOptions(matmul_precision="highest")).tree
    want = np.asarray(jax.jit(grad)(w1, w2, x))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_a_scans_input_keeps_its_steps_contiguous_for_the_slice_each_iteration_takes() -> None:
    """``lax.scan`` over ``xs: f32[128,16,32]`` slices one step per iteration. Stored compactly (the 128 steps
    in the lanes, no padding) each slice is 512 single-element runs and a relayout, every iteration (the
    RNN scan: 133 us on v5e); the order choice now weighs a loop body's costs by its trip count and a slice
    by its window's runs, so the steps stay major and each slice is whole rows (74 us). Forwarding a value
    (a tuple) moves no bytes and no longer counts as a read of it."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from e2e_support import run_checked

    def scan(wh, wx, xs, h0):  # type: ignore[no-untyped-def]
        def cell(h, x):  # type: ignore[no-untyped-def]
            h = jnp.tanh(h @ wh + x @ wx)
            return h, jnp.sum(h, -1)

        return jax.lax.scan(cell, h0, xs)

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((128, 128), (32, 128), (128, 16, 32), (16, 128))]
    module = parse_module(jax.jit(scan).lower(*args).as_text(dialect="hlo"))
    checked = run_checked(module, args, config="tpu_v5e")  # (against the reference, the MXU's precision emulated)
    checked.assert_ok("scan")
    result = checked.result
    slices = [
        i
        for c in result.compiled.module.computations
        for i in c.instructions
        if i.opcode == "dynamic-slice" and i.array_shape.dimensions == (1, 16, 32)
    ]
    assert slices and all(i.array_shape.effective_layout.minor_to_major[0] == 2 for i in slices)
    assert result.seconds < 100e-6, result.seconds
