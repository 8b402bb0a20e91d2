"""HLO parser: real JAX/XLA modules in every printed form, typed attribute values checked against what the
JAX program asked for, source locations from metadata, and one test per class of error."""

from __future__ import annotations

import re
from pathlib import Path

import hlo_corpus as hc
import numpy as np
import pytest

from tpusim.compiler.hlo import HloParseError, HloVerifyError, load_module, parse_module
from tpusim.compiler.hlo.ir import ConvDims, Literal, PadDim, ProgramShape, Raw, ReplicaGroups, SliceDim, Window
from tpusim.errors import SourceError
from tpusim.memory import Layout, Shape, Tile, TupleShape, parse_shape

SAMPLES = Path(__file__).parent / "hlo_samples"


def _instructions(module, opcode):
    return [i for c in module.computations for i in c.instructions if i.opcode == opcode]


def _only(module, opcode):
    found = _instructions(module, opcode)
    assert len(found) == 1, [i.name for i in found]
    return found[0]


# ---------------------------------------------------------------------------------------------
# The corpus: every function in every form parses and verifies
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(hc.FUNCTIONS))
@pytest.mark.parametrize("form", hc.FORMS)
def test_jax_corpus_parses_and_verifies(name, form):
    module = parse_module(hc.hlo_text(name, form), f"{name}.{form}.hlo")
    layout = module.attributes["entry_computation_layout"]
    assert isinstance(layout, ProgramShape)
    assert layout.parameters == tuple(p.shape for p in module.entry_computation.parameters)
    # A PRNG key argument is a u32[2] array in HLO; the compiled collectives module is SPMD-partitioned
    # (per-device shapes).
    if name != "rng" and (name, form) != ("collectives", "optimized"):
        args = hc.FUNCTIONS[name][1]
        assert [p.dimensions for p in layout.parameters] == [tuple(a.shape) for a in args]
    assert module.entry_computation.is_entry
    if form == "optimized":
        assert module.attributes["is_scheduled"] is True
        assert [t for t, _ in module.sections] == ["FileNames", "FunctionNames", "FileLocations", "StackFrames"]


def test_samples_parse(tmp_path):
    for path in sorted(SAMPLES.glob("*.hlo")):
        if path.name == "elided.hlo":
            continue
        module = load_module(path)
        assert module.computations, path


def test_forms_from_xla_tests():
    module = load_module(SAMPLES / "xla_forms.hlo")
    e = module.entry_computation
    assert e.root == "out" and e.instructions[-1].name == "send-done"
    assert e["cc"].attr("literal").value.tolist() == [1, 2] and e["cc"].attr("custom_call_target") == 'with"quote'
    assert e["cc"].attr("backend_config") == Raw('{key: "value"}')
    assert e["cc1"].attr("literal").value == np.float32(0.5) and e["cc1"].attr("schedule") == "SCHEDULE_EARLIEST"
    tup = e["cc2"].attr("literal")
    assert [t.value.tolist() for t in tup.tuple_elements] == [[4, 5, 6], [True, False]]
    assert e["cc3"].attr("operand_layout_constraints") == (parse_shape("f32[4]{0}"),)
    assert e["k"].attr("literal").value.reshape(-1).tolist() == [1, 2, 3, 4]
    assert e["flag"].loc.op_name == '"it\'s" fine\n' and e["flag"].loc.source_line == 7
    assert e["mm"].attr("dim_labels") == ConvDims(0, 1, (), 0, 1, (), 0, 1, ())
    assert [d.reversal for d in e["back"].attr("window").dims] == [True, True]
    assert e["send"].attr("control-predecessors") == ("recv",)
    assert e["cond"].attr("true_computation") == "neg" and e["cond"].attr("false_computation") == "ident"
    assert module["max"].instructions[0].attr("origin") == Raw("{[synthetic_call]}")
    assert isinstance(module.attributes["origin_recovery_table"], Raw)
    assert e["v0"].attr("statistics") == Raw("{visualizing_index=1,stat-1=0.5,stat-2=4}")
    # A literal's shape written without a layout (our reading: the braces after a space are the value).
    text = (SAMPLES / "xla_forms.hlo").read_text().replace("s32[3]{0} {4, 5, 6}", "s32[3] {4, 5, 6}")
    assert parse_module(text).entry_computation["cc2"].attr("literal").tuple_elements[0].value.tolist() == [4, 5, 6]


def test_unknown_dimensions_in_dim_labels_are_kept_verbatim():
    text = "ENTRY e {\n ROOT r = f32[100]{0} custom-call(), window={size=2x2}, dim_labels=?b01f_0?1io->b01?f, "
    text += 'custom_call_target="t"\n}'
    assert parse_module(text).entry_computation.root_instruction.attr("dim_labels") == Raw("?b01f_0?1io->b01?f")


def test_sharded_tpu_lowering_keeps_sharding_verbatim():
    module = parse_module(hc.sharded_tpu_text())
    a = module.entry_computation.parameters[0]
    assert a.attr("sharding") == Raw("{devices=[2,4]<=[8]}")
    assert isinstance(a.attr("frontend_attributes"), Raw)
    assert isinstance(module.attributes["frontend_attributes"], Raw)


# ---------------------------------------------------------------------------------------------
# Typed attribute values against the JAX program
# ---------------------------------------------------------------------------------------------
def test_dot_dimension_numbers_and_precision():
    dot = _instructions(parse_module(hc.hlo_text("mlp", "short")), "dot")[0]
    assert dot.attr("lhs_contracting_dims") == (1,) and dot.attr("rhs_contracting_dims") == (0,)
    att = _instructions(parse_module(hc.hlo_text("attention", "short")), "dot")[0]
    assert att.attr("lhs_batch_dims") == (0,) and att.attr("rhs_batch_dims") == (0,)
    assert att.attr("lhs_contracting_dims") == (2,) and att.attr("rhs_contracting_dims") == (2,)
    text = "ENTRY e {\n a = f32[2,2] parameter(0)\n ROOT d = f32[2,2] dot(a, a), lhs_contracting_dims={1}, "
    text += "rhs_contracting_dims={0}, operand_precision={highest,DEFAULT}\n}"
    d = parse_module(text).entry_computation.root_instruction
    assert d.attr("precision_config") == ("highest", "default") and "operand_precision" not in d.attributes


def test_convolution_window_and_dim_labels():
    conv = _only(parse_module(hc.hlo_text("conv", "short")), "convolution")
    assert conv.attr("dim_labels") == ConvDims(0, 3, (1, 2), 2, 3, (0, 1), 0, 3, (1, 2))
    dims = conv.attr("window").dims
    assert [(d.size, d.stride, d.pad_low, d.pad_high, d.lhs_dilate, d.rhs_dilate) for d in dims] == [
        (3, 2, 1, 1, 1, 2)
    ] * 2
    grouped = _only(parse_module(hc.hlo_text("grouped_conv", "short")), "convolution")
    assert grouped.attr("feature_group_count") == 2
    assert grouped.attr("dim_labels") == ConvDims(0, 1, (2, 3), 1, 0, (2, 3), 0, 1, (2, 3))
    assert [(d.lhs_dilate, d.pad_low, d.pad_high) for d in grouped.attr("window").dims] == [(2, 1, 2), (2, 0, 1)]


def test_reduce_window_and_select_and_scatter():
    module = parse_module(hc.hlo_text("windows", "short"))
    windows = [i.attr("window") for i in _instructions(module, "reduce-window")]
    assert all(isinstance(w, Window) for w in windows)
    sizes = sorted(tuple(d.size for d in w.dims) for w in windows)
    assert (1, 2, 2, 1) in sizes and (1, 3, 3, 1) in sizes
    assert any(tuple(d.lhs_dilate for d in w.dims) == (1, 2, 1, 1) for w in windows)
    sas = _only(module, "select-and-scatter")
    assert sas.attr("select") in module and sas.attr("scatter") in module


def test_control_flow_attributes():
    while_ = _instructions(parse_module(hc.hlo_text("while", "short")), "while")[0]
    assert isinstance(while_.attr("condition"), str) and isinstance(while_.attr("body"), str)
    module = parse_module(hc.hlo_text("cond", "short"))
    branches = [i.attr("branch_computations") for i in _instructions(module, "conditional")]
    assert sorted(len(b) for b in branches) == [2, 3]
    assert all(name in module for b in branches for name in b)


def test_sort_topk_gather_scatter_fft_attributes():
    module = parse_module(hc.hlo_text("sort", "short"))
    sorts = _instructions(module, "sort")
    assert all(s.attr("is_stable") is True and s.attr("dimensions") == (0,) for s in sorts)
    topk = _only(module, "topk")
    assert topk.attr("k") == 2 and topk.attr("largest") is True
    module = parse_module(hc.hlo_text("gather_scatter", "short"))
    g = _only(module, "gather")
    assert (g.attr("offset_dims"), g.attr("collapsed_slice_dims"), g.attr("start_index_map")) == ((1,), (0,), (0,))
    assert (g.attr("index_vector_dim"), g.attr("slice_sizes")) == (1, (1, 4))
    for s in _instructions(module, "scatter"):
        assert isinstance(s.attr("update_window_dims"), tuple) and isinstance(s.attr("index_vector_dim"), int)
        assert isinstance(s.attr("indices_are_sorted", False), bool) and isinstance(
            s.attr("unique_indices", False), bool
        )
    ffts = _instructions(parse_module(hc.hlo_text("fft", "short")), "fft")
    assert {(f.attr("fft_type"), f.attr("fft_length")) for f in ffts} == {
        ("FFT", (8,)),
        ("RFFT", (8, 8)),
        ("IRFFT", (8,)),
        ("IFFT", (8,)),
    }


def test_shape_ops_attributes():
    module = parse_module(hc.hlo_text("shape_ops", "short"))
    pads = {p.attr("padding") for p in _instructions(module, "pad")}
    assert (PadDim(1, -1, 1), PadDim(0, 0, 2)) in pads and (PadDim(1, 2, 0), PadDim(0, 3, 0)) in pads
    slices = {s.attr("slice") for s in _instructions(module, "slice")}
    assert (SliceDim(1, 3, 1), SliceDim(0, 6, 2)) in slices
    assert _only(module, "reduce-precision").attr("exponent_bits") == 5
    assert {i.attr("iota_dimension") for i in _instructions(module, "iota")} == {0}
    assert any(d.attr("dynamic_slice_sizes") == (2, 2) for d in _instructions(module, "dynamic-slice"))
    # Each compare keeps the direction written on its own line. (That it is one of EQ..GE needs no check here:
    # the verifier rejects any other, tests/test_bad_hlo_inputs.py.)
    compares = _instructions(module, "compare")
    lines = hc.hlo_text("shape_ops", "short").splitlines()
    assert compares
    for c in compares:
        assert re.search(rf"\bdirection={c.attr('direction')}\b", lines[c.loc.line - 1]), lines[c.loc.line - 1]


def test_linalg_on_tpu_lowering():
    module = parse_module(hc.hlo_text("linalg", "tpu"))
    assert _only(module, "cholesky").attr("lower") is True
    ts = _only(module, "triangular-solve")
    assert (ts.attr("left_side"), ts.attr("lower"), ts.attr("transpose_a")) == (True, True, "NO_TRANSPOSE")


def test_collectives_replica_groups_and_pairs():
    module = parse_module(hc.hlo_text("collectives", "optimized"))
    assert module.num_partitions == 8
    psum = _only(module, "all-reduce")
    assert psum.attr("replica_groups").groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert psum.attr("channel_id") == 1 and psum.attr("use_global_device_ids") is True
    gather = _only(module, "all-gather")
    assert gather.attr("replica_groups").groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and gather.attr("dimensions") == (0,)
    permute = _only(module, "collective-permute")
    ring = tuple((b * 4 + i, b * 4 + (i + 1) % 4) for b in range(2) for i in range(4))
    assert permute.attr("source_target_pairs") == ring


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("{{0,1},{2,3}}", ((0, 1), (2, 3))),
        ("{}", ()),
        ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("[2,4]<=[4,2]T(1,0)", ((0, 2, 4, 6), (1, 3, 5, 7))),
        ("[4,2]<=[2,2,2]T(2,1,0)", ((0, 4), (2, 6), (1, 5), (3, 7))),
        ("mesh[x=2,y=4] {y}", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("mesh[x=2,y=4] {x}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("mesh[x=2,y=4] {y,x}", ((0, 4, 1, 5, 2, 6, 3, 7),)),
        ("mesh[a=8] {a:(1)2}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("mesh[a=8] {a:(4)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),
        ("mesh[x=2,y=2], device_ids=(3,2,1,0) {x}", ((3, 1), (2, 0))),
        ("mesh[x=2,y=2], device_ids=([2,2]T(1,0)) {y}", ((0, 2), (1, 3))),
        ("mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ('mesh["x"=2,"y"=4] {"y":(1)2}', ((0, 2), (1, 3), (4, 6), (5, 7))),
    ],
)
def test_replica_groups_forms(text, groups):
    module = parse_module(
        "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\n"
        f"ENTRY e {{\n p = f32[8] parameter(0)\n ROOT r = f32[8] all-reduce(p), replica_groups={text}, to_apply=add\n}}"
    )
    value = module.entry_computation.root_instruction.attr("replica_groups")
    assert value == ReplicaGroups(groups, text)


@pytest.mark.parametrize("case", sorted(hc.SPMD_CASES))
def test_mesh_replica_groups_printed_by_xla(case):
    """XLA's SPMD partitioner prints mesh-form groups; they must be the devices that share the reduced axis."""
    module = parse_module(hc.spmd_text(case))
    reduction = module.entry_computation.root_instruction
    assert reduction.opcode == "all-reduce"
    assert reduction.attr("replica_groups").groups == hc.SPMD_CASES[case][2]


def test_iota_groups_agree_with_numpy():
    # [G,S]<=[dims]T(perm): iota over dims, transposed by perm, reshaped to G groups of S (XLA's IotaTileAssignment).
    groups = parse_module(
        "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\nENTRY e {\n"
        " p = f32[8] parameter(0)\n ROOT r = f32[8] all-reduce(p), replica_groups=[3,8]<=[2,3,4]T(2,0,1),"
        " to_apply=add\n}"
    ).entry_computation.root_instruction.attr("replica_groups")
    expected = np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1).reshape(3, 8)
    assert np.array_equal(np.array(groups.groups), expected)


# ---------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------
def _bits(a):
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}") if a.dtype.kind != "c" else np.uint8)


@pytest.mark.parametrize("form", ["short", "tpu", "optimized"])
def test_jax_constants_are_bit_exact(form):
    module = parse_module(hc.hlo_text("consts", form))
    literals = [i.attr("literal") for i in _instructions(module, "constant")]
    values = [lit.value for lit in literals if lit.value is not None and lit.value.size > 1]
    # XLA CPU's optimisations compute narrow floats in f32, so their constants change type: check f32 there.
    names = ("f32", "big") if form == "optimized" else tuple(hc.CONSTANTS)
    for name in names:
        expected = hc.CONSTANTS[name]
        found = [v for v in values if v.dtype == expected.dtype and v.shape == expected.shape]
        assert any(np.array_equal(_bits(v), _bits(expected)) for v in found), (name, found)


def test_every_element_type_and_special_value():
    module = load_module(SAMPLES / "constants.hlo")
    c = module.entry_computation

    def lit(name):
        return c[name].attr("literal").value

    f = _bits(lit("c_f32"))
    assert [hex(b) for b in f[:4]] == ["0x7fc00000", "0xffc00000", "0x7f800001", "0xffffffff"]
    assert lit("c_f32")[4] == np.inf and lit("c_f32")[5] == -np.inf and np.signbit(lit("c_f32")[6])
    assert lit("c_f32")[7] == np.float32(1.4e-45) > 0
    assert [hex(b) for b in _bits(lit("c_bf16"))] == ["0x3fc0", "0x8000", "0xff80", "0x7f83"]
    assert lit("c_f16").dtype == np.float16 and lit("c_f16")[0] == 65504
    assert lit("c_f8e4m3fn").dtype.name == "float8_e4m3fn" and lit("c_f8e4m3fn")[0] == 448
    assert [hex(b) for b in _bits(lit("c_f8e4m3fn"))] == ["0x7e", "0x80", "0x7f", "0x1"]
    assert np.isneginf(lit("c_f8e5m2")[1]) and np.isnan(lit("c_f8e5m2")[2])
    assert lit("c_c64")[0] == 1 + 2j and np.signbit(lit("c_c64")[1].real) and np.isnan(lit("c_c64")[2].imag)
    assert lit("c_c128")[0] == complex(0.1, -1e300)
    assert lit("c_scalar_pred") == np.True_ and lit("c_scalar_pred").shape == ()
    assert lit("c_preds").tolist() == [[True, False], [False, True]]
    assert lit("c_s4").tolist() == [-8, 7, 0] and lit("c_s4").dtype.name == "int4"
    assert lit("c_u64")[0] == 2**64 - 1 and lit("c_s64")[0] == -(2**63)
    assert lit("c_rank3").shape == (2, 2, 2) and lit("c_rank3")[1, 0, 1] == 6
    assert lit("c_empty").shape == (0,) and lit("c_empty2").shape == (2, 0)
    t = c["c_tuple"].attr("literal")
    assert t.value is None and t.tuple_elements[0].value.tolist() == [1.0, 2.0]
    assert t.tuple_elements[1].tuple_elements[1].value == np.False_
    assert lit("c_scalar") == np.float32(-2.5e-07)


def test_large_constant_in_full():
    module = parse_module(hc.hlo_text("consts", "optimized"))
    big = [i.attr("literal") for i in _instructions(module, "constant") if i.attr("literal").value.size == 1000]
    assert np.array_equal(big[0].value, hc.CONSTANTS["big"])


# ---------------------------------------------------------------------------------------------
# Module structure, layouts, source locations
# ---------------------------------------------------------------------------------------------
def test_tpu_style_module():
    module = load_module(SAMPLES / "tpu_scheduled.hlo")
    assert module.attributes["is_scheduled"] is True and module.num_partitions == 8 and module.replica_count == 1
    assert module.attributes["input_output_alias"] == Raw("{ {1}: (1, {}, may-alias) }")
    layout = module.attributes["entry_computation_layout"]
    assert layout.parameters[0] == parse_shape("bf16[256,512]{1,0:T(8,128)(2,1)}")
    e = module.entry_computation
    done = e["copy-done"].shape
    assert done.layout == Layout((1, 0), (Tile((8, 128)), Tile((2, 1))), memory_space=1)
    assert e["copy-start"].shape.elements[2] == Shape("u32", (), layout=Layout((), memory_space=2))
    start = e["custom-call-start"]
    assert start.opcode == "async-start" and start.attr("async_wrapped_opcode") == "custom-call"
    assert start.attr("custom_call_target") == "SparseDenseMatmulOp"
    wrapped = start.async_wrapped_instruction()
    assert wrapped.opcode == "custom-call" and wrapped.shape == e["custom-call-done"].shape
    assert e["custom-call-done"].opcode == "async-done"
    assert e["add.10"].attr("control-predecessors") == ("all-gather-done",)
    assert e["fusion"].attr("kind") == "kOutput" and e["fusion"].attr("calls") == "fused_computation"
    assert e["fusion"].loc.source_file == "/home/user/train.py" and e["fusion"].loc.source_line == 42
    dot = module["fused_computation"]["dot.2"]
    assert dot.loc.source_line == 41 and dot.loc.op_name == "jit(train_step)/dot_general"
    assert dot.attr("precision_config") == ("default", "highest")
    assert e["copy-start"].attr("cross_program_prefetch_index") == 0


ASYNC_LONG = """HloModule m

%async_comp (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}, execution_thread="sc"

ENTRY %e (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %s = ((f32[8]{0}), f32[8]{0}, s32[]) async-start(%x), async_execution_thread="sc", calls=%async_comp
  %u = ((f32[8]{0}), f32[8]{0}, s32[]) async-update(%s)
  ROOT %d = f32[8]{0} async-done(%u)
}
"""


def test_async_ops_in_both_forms():
    long = parse_module(ASYNC_LONG)
    start = long.entry_computation["s"]
    assert start.attr("calls") == "async_comp" and start.async_wrapped_instruction() is None
    assert long["async_comp"].attributes["execution_thread"] == "sc"
    # What XLA prints for the same module (jaxlib's parser + printer): the short form without the computation.
    short = parse_module(hc.xla_parse(ASYNC_LONG).to_string())
    e = short.entry_computation
    assert [(i.opcode, i.attr("async_wrapped_opcode")) for i in e.instructions[1:]] == [
        ("async-start", "negate"),
        ("async-update", "negate"),
        ("async-done", "negate"),
    ]
    wrapped = e["s"].async_wrapped_instruction()
    assert (wrapped.opcode, wrapped.operands, str(wrapped.shape)) == ("negate", ("x",), "f32[8]{0}")
    bad = ASYNC_LONG.replace("ROOT %n = f32[8]{0} negate(%p)", "ROOT %n = f32[4]{0} slice(%p), slice={[0:4]}")
    bad = bad.replace("(p: f32[8]) -> f32[8]", "(p: f32[8]) -> f32[4]")
    with pytest.raises(HloVerifyError, match=r"the async computation async_comp returns f32\[4\]\{0\}, expected "):
        parse_module(bad)


def test_legacy_forms():
    module = load_module(SAMPLES / "legacy_forms.hlo")
    assert module.name == "module_main" and module.entry == "main" and module["main"].is_entry
    assert module["max"].attributes["execution_thread"] == "main"
    main = module["main"]
    assert main.root == "f" and main.instructions[-1].name == "crs"
    g = main["gather"]
    assert dict(g.attributes.items()) == {
        "offset_dims": (1,),
        "collapsed_slice_dims": (0,),
        "start_index_map": (0,),
        "index_vector_dim": 1,
        "slice_sizes": (1, 3),
    }
    assert main["f"].loc.op_name == "old/convert"
    assert main["typed"].attr("literal").value.tolist() == [[1, 2], [3, 4]]
    typed_tuple = main["typed_tuple"].attr("literal")
    assert typed_tuple.tuple_elements[0].value.tolist() == [5, 6] and typed_tuple.tuple_elements[1].value == 7
    crs = main["crs"]
    assert crs.opcode == "all-reduce" and crs.attr("channel_id") == 1 and "all_reduce_id" not in crs.attributes
    barrier = load_module(SAMPLES / "legacy_forms.hlo").entry_computation  # barrier="..." was an all-reduce string
    text = (SAMPLES / "legacy_forms.hlo").read_text().replace("all_reduce_id=1,", 'all_reduce_id=1, barrier="b0",')
    assert parse_module(text).entry_computation["crs"].attr("barrier") == "b0" and barrier.name == "main"
    with pytest.raises(HloParseError, match=r"written as f32\[3\] but its shape is f32\[2,2\]"):
        parse_module(text.replace("constant(f32[2,2] {{1, 2}, {3, 4}})", "constant(f32[3] {1, 2, 3})"))
    lines = (SAMPLES / "legacy_forms.hlo").read_text().splitlines()
    gather_line = next(i for i, line in enumerate(lines, 1) if "%gather =" in line)
    assert main["gather"].loc.line == gather_line and main["gather"].loc.column == 4


def test_source_locations_from_stack_frames():
    module = parse_module(hc.hlo_text("attention", "debug"), "attention.hlo")
    softmax_line = hc.function_line("attention", "softmax")
    einsum_line = hc.function_line("attention", "bqd,bkd")
    dots = _instructions(module, "dot")
    assert {d.loc.source_line for d in dots} == {einsum_line, softmax_line}
    assert all(d.loc.source_file.endswith("hlo_corpus.py") for d in dots)
    assert all(d.loc.hlo_file == "attention.hlo" and d.loc.line > 0 for d in dots)
    text = hc.hlo_text("attention", "debug").splitlines()
    for d in dots:
        assert text[d.loc.line - 1][d.loc.column - 1 :].startswith(d.name)


def test_source_locations_in_optimized_module():
    module = parse_module(hc.hlo_text("collectives", "optimized"))
    psum = _only(module, "all-reduce")
    assert psum.loc.source_line == hc.function_line("collectives", "lax.psum") and psum.loc.op_name.endswith("psum")


def test_root_defaults_to_last_and_entry_to_last_computation():
    module = parse_module("f {\n a = f32[] parameter(0)\n b = f32[] negate(a)\n}\ng {\n x = f32[] constant(1)\n}")
    assert module.entry == "g" and module["f"].root == "b" and module["g"].is_entry and not module["f"].is_entry


def test_computation_names_and_instruction_names_with_dots_and_dashes():
    text = (
        "HloModule m.1-x\n%comp.a-b_c (p.0: f32[]) -> f32[] {\n %p.0 = f32[] parameter(0)\n"
        " ROOT %neg-1.x = f32[] negate(f32[] %p.0)\n}\nENTRY %main (q: f32[]) -> f32[] {\n"
        " %q = f32[] parameter(0)\n ROOT %call.2 = f32[] call(%q), to_apply=%comp.a-b_c\n}\n"
    )
    module = parse_module(text)
    assert module.name == "m.1-x" and module["comp.a-b_c"].root == "neg-1.x"
    assert module.entry_computation.root_instruction.attr("to_apply") == "comp.a-b_c"


def test_shapes_without_layout_stay_without_layout():
    module = parse_module(
        "ENTRY e {\n p = f32[2,3] parameter(0)\n ROOT t = f32[3,2]{0,1} transpose(p), dimensions={1,0}\n}"
    )
    e = module.entry_computation
    assert e["p"].shape.layout is None and e["t"].shape.layout == Layout((0, 1))


def test_dynamic_shapes():
    text = "ENTRY e {\n p = f32[<=4,?] parameter(0)\n ROOT n = f32[<=4,?] negate(p)\n}"
    shape = parse_module(text).entry_computation.root_instruction.shape
    assert shape.dynamic == (True, True) and shape.dimensions[0] == 4


def test_tuple_shapes_with_index_comments():
    text = "ENTRY e {\n p = (f32[], s32[], /*index=2*/pred[]) parameter(0)\n"
    text += " ROOT g = pred[] get-tuple-element(p), index=2\n}"
    shape = parse_module(text).entry_computation.parameters[0].shape
    assert isinstance(shape, TupleShape) and len(shape.elements) == 3


# ---------------------------------------------------------------------------------------------
# Errors: one test per class, each with file, line, column, caret, expected and found
# ---------------------------------------------------------------------------------------------
BASE = """HloModule m

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  p = f32[4]{0} parameter(0)
  c = f32[] constant(0)
  ROOT r = f32[] reduce(p, c), dimensions={0}, to_apply=add
}
"""


def _error(old, new, error=HloParseError):
    text = BASE.replace(old, new, 1)
    assert text != BASE
    with pytest.raises(error) as info:
        parse_module(text, "m.hlo")
    return info.value


@pytest.mark.parametrize(
    ("old", "new", "line", "column", "message"),
    [
        ("add(a, b)", "addd(a, b)", 6, 18, r"unknown opcode 'addd'; did you mean add\?"),
        ("ROOT s = f32[] add(a, b)", "ROOT s = f32[] cos(a)", 6, 18, r"unknown opcode 'cos'; did you mean cosine"),
        (
            "dimensions={0}",
            "dimension={0}",
            12,
            32,
            r"unknown attribute 'dimension' for opcode reduce \(allowed: "
            r"dimensions, to_apply\); did you mean 'dimensions'\?",
        ),
        ("reduce(p, c)", "reduce(q, c)", 12, 25, r"operand %q is not defined before this point in computation main"),
        (
            "to_apply=add",
            "to_apply=addd",
            12,
            57,
            r"to_apply names computation addd, which is not defined .*did you "
            r"mean add\?",
        ),
        (
            "c = f32[] constant(0)",
            "p = f32[] constant(0)",
            11,
            3,
            r"instruction %p is defined twice in computation "
            r"main \(first at line 10\)",
        ),
        ("  c = f32[] constant(0)", "  ROOT c = f32[] constant(0)", 12, 3, r"a second ROOT in computation main"),
        (", dimensions={0}", "", 12, 18, r"reduce %r needs attribute\(s\) dimensions"),
        ("p = f32[4]{0}", "p = f32[4]{1}", 10, 14, r"minor_to_major entry 1 is not a dimension of a rank-1 shape"),
        ("p = f32[4]{0}", "p = f33[4]{0}", 10, 7, r"unknown element type 'f33'"),
        ("constant(0)", "constant(abc)", 11, 22, r"expected a floating-point value for f32, found 'abc'"),
        ("constant(0)", "constant({0, 1})", 11, 22, r"expected a value of type f32, found '\{'"),
        ("to_apply=add", 'to_apply=add, metadata={op_name="x}', 12, 80, r"unterminated string"),
        ("reduce(p, c)", "reduce(p)", 12, 25, r"reduce takes at least 2 operands, found 1"),
        (
            "reduce(p, c)",
            "reduce(p, c",
            12,
            31,
            r"expected '\)' to end the operands, found the attribute 'dimensions='",
        ),
        ("ENTRY main {", "ENTRY main", 10, 3, r"expected '\{' to start the body of computation main, found 'p'"),
        ("add {", "ENTRY add {", 9, 1, r"a second ENTRY computation \(the first is add\)"),
        ("HloModule m", "HloModule m, foo=1", 1, 14, r"unknown attribute 'foo' in the HloModule header"),
        ("dimensions={0}", "dimensions={0,x}", 12, 46, r"expected an integer or '\}' in a list of integers"),
        (
            "ENTRY main {",
            "ENTRY main () -> s32[] {",
            9,
            12,
            r"computation main declares result s32\[\] but its "
            r"root %r has shape f32\[\]",
        ),
        (
            "  p = f32[4]{0}",
            "  p = f32[4]{0} parameter0)\n  q = f32[4]{0}",
            10,
            17,
            r"expected an opcode and '\(' "
            r"after the shape of %p, found 'parameter0'",
        ),
        ("parameter(0)\n  c", "parameter(x)\n  c", 10, 27, r"expected the parameter number and '\)'"),
        ("  ROOT r", "  r = f32[] reduce(p c)\n  ROOT r", 12, 22, r"expected '\)' or ',' after an operand, found 'c'"),
        ("to_apply=add\n}", "to_apply=add\n", 14, 1, r"computation main is never closed"),
        (
            "ROOT s = f32[] add(a, b)",
            "ROOT s = add(a, b)",
            6,
            12,
            r"expected the result shape of %s before its opcode add",
        ),
        ("add(a, b)", "add(f32[] multiply(a, b), b)", 6, 28, r"found the nested instruction 'multiply\(...\)'"),
        ("to_apply=add", "to_apply={\n  x = f32[] constant(0)\n}", 12, 57, r"expected a computation name, found '\{'"),
    ],
)
def test_parse_errors(old, new, line, column, message):
    err = _error(old, new)
    assert isinstance(err, SourceError)
    assert (err.line, err.column) == (line, column), str(err)
    assert re.search(message, err.message), err.message
    head, shown, caret = str(err).splitlines()
    assert head.startswith(f"HLO parse error at m.hlo:{line}:{column}: ")
    assert caret.index("^") - 2 == column - 1 and shown[2:] == err.line_text


def test_elided_constant_says_how_to_print_it_in_full():
    with pytest.raises(HloParseError, match=r"elided as \{\.\.\.\}.*--xla_dump_large_constants.*print_large_constants"):
        load_module(SAMPLES / "elided.hlo")
    with pytest.raises(HloParseError, match=r"elided as \{\.\.\.\}"):
        parse_module(hc.hlo_text("consts", "elided"))


@pytest.mark.parametrize(
    ("shape", "value", "message"),
    [
        ("f32[2]", "{1, 2, 3}", r"dimension 0 of f32\[2\] has 2 entries, found more"),
        ("f32[2,2]", "{{1, 2}, {3}}", r"dimension 1 of f32\[2,2\] has 2 entries, found 1 before this '\}'"),
        ("f32[2,2]", "{{1, 2}, {3, 4, 5}}", r"dimension 1 of f32\[2,2\] has 2 entries, found more"),
        ("f32[2]", "{{1}, {2}}", r"too many nested '\{'"),
        ("s8[1]", "{300}", r"value 300 is out of range for s8 \[-128, 127\]"),
        ("u8[1]", "{-1}", r"value -1 is out of range for u8"),
        ("f32[1]", "{1e39}", r"value 1e39 is out of range for f32"),
        ("s32[1]", "{1.5}", r"expected an integer for s32, found '1.5'"),
        ("pred[1]", "{2}", r"expected true, false, 1 or 0 for pred, found '2'"),
        ("f32[1]", "{nan(0x800000)}", r"NaN payload 0x800000 does not fit the 23-bit mantissa of f32"),
        ("c64[1]", "{1}", r"the constant's value does not have the shape c64\[1\]"),
        ("f32[3]", "{1, ...}", r"elided"),
        ("token[]", "0", r"a constant cannot have element type token"),
    ],
)
def test_constant_errors(shape, value, message):
    text = f"HloModule m\n\nENTRY e {{\n  ROOT c = {shape} constant({value})\n}}\n"
    with pytest.raises(HloParseError, match=message) as info:
        parse_module(text, "c.hlo")
    assert info.value.line == 4 and info.value.column >= 23


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("window={size=3 foo=2}", r"unknown window field 'foo'"),
        ("window={size=3 stride=2x2}", r"window field 'stride' has 2 dimensions but size= has 1"),
        ("window={size=3 pad=1_1_1}", r"window padding has low_high per dimension"),
        ("window={size=3 size=3}", r"window field 'size' appears twice"),
    ],
)
def test_window_errors(attribute, message):
    text = (
        "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\nENTRY e {\n"
        f" p = f32[8] parameter(0)\n z = f32[] constant(0)\n ROOT r = f32[6] reduce-window(p, z), {attribute}, "
        "to_apply=add\n}"
    )
    with pytest.raises(HloParseError, match=message):
        parse_module(text)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("b01f_01io->b0f", r"input, kernel and output have 2, 2 and 1 spatial dimensions"),
        ("bb1f_01io->b01f", r"the input labels 'bb1f' repeat a dimension"),
        ("b02f_01io->b01f", r"need 'b', 'f' and spatial digits 0..n-1"),
        ("bf01", r"expected convolution dimension labels like b01f_01io->b01f"),
    ],
)
def test_dim_labels_errors(labels, message):
    text = (
        "ENTRY e {\n x = f32[1,5,5,2] parameter(0)\n k = f32[3,3,2,4] parameter(1)\n"
        f" ROOT c = f32[1,3,3,4] convolution(x, k), window={{size=3x3}}, dim_labels={labels}\n}}"
    )
    with pytest.raises(HloParseError, match=message):
        parse_module(text)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ("[2,3]<=[8]", r"hold different numbers of devices"),
        ("[2,4]<=[4,2]T(1,1)", r"is not a permutation"),
        ("mesh[x=2] {z}", r"expected a mesh axis \(x\), found 'z'"),
        ("mesh[a=8] {a:(3)2}", r"sub-axis a:\(3\)2 does not divide axis a=8"),
        ("{{0,1},{2,x}}", r"expected an integer or '\}'"),
        ("whatever", r"expected replica groups like"),
    ],
)
def test_replica_group_errors(groups, message):
    text = (
        "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT c = f32[] add(a, b)\n}\nENTRY e {\n"
        f" p = f32[8] parameter(0)\n ROOT r = f32[8] all-reduce(p), replica_groups={groups}, to_apply=add\n}}"
    )
    with pytest.raises(HloParseError, match=message):
        parse_module(text)


def test_other_attribute_errors():
    head = "ENTRY e {\n p = f32[4] parameter(0)\n"
    cases = [
        (" ROOT s = f32[2] slice(p), slice={[0:2:x]}", r"expected a range \[start:limit\]"),
        (" ROOT s = f32[6] pad(p, p), padding=1_1_", r"expected padding like 0_0x1_2"),
        (
            " ROOT s = f32[4] custom-call(p), custom_call_target=foo",
            r"expected the attribute value \(a quoted string\)",
        ),
        (' ROOT s = f32[4] negate(p), metadata={op_name="a"', r"never closed"),
        (
            ' ROOT s = (f32[4], f32[4]) custom-call(p), custom_call_target="x", operand_precision={fastest}',
            r"expected a precision \(default, high, highest\), found 'fastest'",
        ),
        (" ROOT s = pred[4] compare(p, p), direction=LT, direction=GT", r"attribute 'direction' appears twice"),
        (
            " ROOT s = f32[4] negate(p), sharding={replicated}, metadata={}, to_apply=x",
            r"unknown attribute 'to_apply' "
            r"for opcode negate",
        ),
        (" ROOT s = f32[4] collective-permute(p), source_target_pairs={{0,1,2}}", r"expected \{source,target\} pairs"),
        (" ROOT s = f32[4] async-start(p)", r"async-start %s needs attribute calls"),
        (" ROOT s = f32[4] sort(p), dimensions={0}, is_stable=maybe, to_apply=x", r"expected true or false"),
    ]
    for body, message in cases:
        with pytest.raises(HloParseError, match=message):
            parse_module(head + body + "\n}")


def test_line_endings_tabs_and_byte_order_mark():
    text = (SAMPLES / "jax_attention_debug.hlo").read_text()
    module = parse_module(text)
    assert parse_module(text.replace("\n", "\r\n")) == module
    assert parse_module(text.replace("  ", "\t")) == module
    assert parse_module("\ufeff" + text) == module


def test_several_modules_in_one_text():
    text = hc.hlo_text("mlp", "short")
    with pytest.raises(HloParseError, match=r"a second HloModule header: the text holds several modules"):
        parse_module(text + "\n\n" + text)


def test_empty_text_and_empty_computation():
    with pytest.raises(HloParseError, match=r"empty text"):
        parse_module("  \n ")
    with pytest.raises(HloParseError, match=r"computation e has no instructions"):
        parse_module("HloModule m\nENTRY e {\n}\n")
    with pytest.raises(HloParseError, match=r"computation e is defined twice \(first at line 2\)"):
        parse_module("HloModule m\ne {\n a = f32[] constant(1)\n}\ne {\n b = f32[] constant(1)\n}\n")


def test_long_lines_are_clipped_around_the_column():
    values = ", ".join(["1"] * 5000)
    text = f"ENTRY e {{\n ROOT c = f32[4999] constant({{{values}}})\n}}"
    with pytest.raises(HloParseError) as info:
        parse_module(text)
    shown = str(info.value).splitlines()
    assert len(shown[1]) < 200 and shown[2].strip() == "^"
    assert shown[1][len(shown[2]) - 1] == "1" and "f32[4999] has 4999 entries, found more" in shown[0]


def test_verification_is_on_by_default_and_can_be_skipped():
    text = BASE.replace("ROOT r = f32[]", "ROOT r = f32[2]")
    with pytest.raises(
        HloVerifyError,
        match=r"computation main, instruction %r \(m.hlo:12\): result f32\[2\] should "
        r"be f32\[\] \(reduce of f32\[4\]\{0\} over \[0\]\)",
    ):
        parse_module(text, "m.hlo")
    assert parse_module(text, verify=False).entry_computation.root_instruction.shape.dimensions == (2,)


def test_literal_type_for_constants():
    c = parse_module("ENTRY e {\n ROOT c = bf16[2]{0} constant({1, 2})\n}").entry_computation.root_instruction
    lit = c.attr("literal")
    assert isinstance(lit, Literal) and lit.shape == c.shape and lit.value.dtype.name == "bfloat16"
    assert list(c.attributes) == ["literal"]
