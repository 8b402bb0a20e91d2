"""Buffer assignment: liveness reuse, alignment, in-place loop state and dynamic-update-slice, OOM errors."""

import numpy as np
import pytest

from tpusim.compiler.buffer_assignment import ALIGNMENT, OutOfMemoryError, assign_buffers
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.layout_assignment import assign_layouts
from tpusim.compiler.tiling_rules import load_tiling_rules
from tpusim.config import load_config

V5E = load_config("tpu_v5e")
RULES = load_tiling_rules("tpu_default")


def _assign(text: str, capacity: int = 1 << 30):  # type: ignore[no-untyped-def]
    module = assign_layouts(parse_module(text), RULES, V5E).module
    return module, assign_buffers(module, capacity)


CHAIN = """
HloModule chain
ENTRY main {
  a = f32[64,128] parameter(0)
  b = f32[64,128] negate(a)
  c = f32[64,128] exponential(b)
  d = f32[64,128] negate(c)
  ROOT e = f32[64,128] exponential(d)
}
"""


def test_parameters_first_then_liveness_reuse() -> None:
    _, buffers = _assign(CHAIN)
    size = 64 * 128 * 4
    a, b, c, d, e = (buffers.buffer("main", n) for n in "abcde")
    assert (a.offset, a.kind) == (0, "parameter")
    assert all(x.offset % ALIGNMENT == 0 for x in (a, b, c, d, e))
    # b dies when c is computed, so d can reuse its bytes; two temporaries are live at a time.
    assert d.offset == b.offset and e.kind == "output"
    assert buffers.hbm_bytes <= 4 * size
    assert len({b.offset, c.offset}) == 2


SCAN = """
HloModule scan
body {
  p = (s32[], f32[8,128], f32[4,8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,128] get-tuple-element(p), index=1
  acc = f32[4,8,128] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  y = f32[8,128] tanh(x)
  y3 = f32[1,8,128] reshape(y)
  zero = s32[] constant(0)
  acc2 = f32[4,8,128] dynamic-update-slice(acc, y3, i, zero, zero)
  ROOT t = (s32[], f32[8,128], f32[4,8,128]) tuple(i2, y, acc2)
}
cond {
  p = (s32[], f32[8,128], f32[4,8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  x0 = f32[8,128] parameter(0)
  z = f32[] constant(0)
  acc0 = f32[4,8,128] broadcast(z), dimensions={}
  i0 = s32[] constant(0)
  init = (s32[], f32[8,128], f32[4,8,128]) tuple(i0, x0, acc0)
  w = (s32[], f32[8,128], f32[4,8,128]) while(init), condition=cond, body=body
  ROOT out = f32[4,8,128] get-tuple-element(w), index=2
}
"""


def test_scan_state_is_updated_in_place() -> None:
    _, buffers = _assign(SCAN)
    state = buffers.buffer("main", "w", (2,))
    # The stacked output is written in place by the dynamic-update-slice: no copy per iteration.
    assert buffers.buffer("body", "acc2") == state
    assert buffers.buffer("main", "acc0") == state  # the loop's operand dies at the loop: shared too
    assert ("body", (2,)) not in buffers.copy_back
    # The elementwise tanh may overwrite the state it reads.
    assert buffers.buffer("body", "y") == buffers.buffer("main", "w", (1,))
    # The counter is a constant operand of the loop, so it is copied into the state first.
    assert ("main", "w", (0,)) in buffers.copy_in
    assert buffers.buffer("main", "out") == state and state.kind == "loop-state"


def test_entry_parameters_are_never_updated_in_place() -> None:
    text = """
HloModule dus
ENTRY main {
  a = f32[4,128] parameter(0)
  u = f32[1,128] parameter(1)
  i = s32[] parameter(2)
  z = s32[] constant(0)
  ROOT r = f32[4,128] dynamic-update-slice(a, u, i, z)
}
"""
    _, buffers = _assign(text)
    assert buffers.buffer("main", "r") != buffers.buffer("main", "a")


def test_out_of_memory_names_buffer_memory_and_sizes() -> None:
    with pytest.raises(
        OutOfMemoryError,
        match=r"^HBM is full: temporary buffer main/c \(f32\[64,128\]\{1,0:T\(8,128\)\}, 32768 bytes\) would end at "
        r"byte \d+, but HBM holds 70000 bytes$",
    ):
        _assign(CHAIN, capacity=70000)


ASYNC = """
HloModule pairs, replica_count=4
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[8,128] parameter(0)
  rs = f32[8,128] all-reduce-start(x), replica_groups={}, to_apply=sum
  r = f32[8,128] all-reduce-done(rs)
  gs = (f32[8,128], f32[32,128]) all-gather-start(x), replica_groups={}, dimensions={0}
  g = f32[32,128] all-gather-done(gs)
  ROOT t = (f32[8,128], f32[32,128]) tuple(r, g)
}
"""


def test_async_done_shares_the_start_buffer_that_holds_its_result() -> None:
    """The done of an async pair reads its result from the start, so it is the same buffer (no copy)."""
    _, buffers = _assign(ASYNC)
    assert buffers.buffer("main", "r") == buffers.buffer("main", "rs")
    assert buffers.buffer("main", "g") == buffers.buffer("main", "gs", (1,))
    assert buffers.buffer("main", "g") != buffers.buffer("main", "gs", (0,))


# A loop body whose temporaries first-fit places in more bytes than their peak of live bytes (the 4 KiB slot
# freed by `s` is too small for `g`), beside loop-state arrays (the bias, which the body only reads): the region
# reserved for the body must hold the placement, or the bias shares bytes with `f` (jax.lax.scan of
# x @ W + b gave wrong rows from the second step on).
FIRST_FIT_BODY = """
HloModule region
body {
  p = (s32[], f32[8,256], f32[256]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  acc = f32[8,256] get-tuple-element(p), index=1
  bias = f32[256] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  s = f32[4,256] slice(acc), slice={[0:4], [0:256]}
  d = f32[8,256] concatenate(s, s), dimensions={0}
  g = f32[8,256] reverse(d), dimensions={0}
  bb = f32[8,256] broadcast(bias), dimensions={1}
  f = f32[8,256] add(g, bb)
  ROOT t = (s32[], f32[8,256], f32[256]) tuple(i2, f, bias)
}
cond {
  p = (s32[], f32[8,256], f32[256]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  a = f32[8,256] parameter(0)
  b = f32[256] parameter(1)
  i0 = s32[] constant(0)
  init = (s32[], f32[8,256], f32[256]) tuple(i0, a, b)
  w = (s32[], f32[8,256], f32[256]) while(init), condition=cond, body=body
  ROOT out = f32[8,256] get-tuple-element(w), index=1
}
"""


def test_loop_body_region_holds_its_first_fit_placement() -> None:
    _, buffers = _assign(FIRST_FIT_BODY)
    state = [buffers.buffer("main", "w", (k,)) for k in (1, 2)]
    for temp in (buffers.buffer("body", n) for n in ("s", "d", "g")):
        for x in state:
            assert temp.offset + temp.size <= x.offset or x.offset + x.size <= temp.offset, (temp, x)


def test_overlapping_live_buffers_are_a_compile_error() -> None:
    """The independent liveness check turns a planner mistake into a compile error, not a wrong answer."""
    from dataclasses import replace

    from tpusim.compiler.buffer_assignment import check_disjoint
    from tpusim.compiler.errors import CompileError

    module, buffers = _assign(FIRST_FIT_BODY)
    check_disjoint(module, buffers)
    bias = buffers.buffer("main", "w", (2,))
    g = buffers.buffer("body", "g")
    moved = list(buffers.buffers)
    moved[g.id] = replace(g, offset=bias.offset)
    # (the bias, state element 2, is passed on unchanged: the loop state shares the buffer of parameter b)
    with pytest.raises(CompileError, match=r"body/g .* main/(w\[2\]|b)|main/(w\[2\]|b) .* body/g"):
        check_disjoint(module, replace(buffers, buffers=tuple(moved)))


# Found by tests/test_loop_properties.py: a body whose root forwards the old state (g17 to leaf 3) while a
# dynamic-update-slice of that state (u25, leaf 4) was chosen to run in place, because the in-place choice
# was made before the root's forwarding was known; and a body whose new state is first written by the
# operand of an in-place dynamic-update-slice (b26) while the old state is still to be read (by m27).
FORWARDED_STATE = """
HloModule forwarded
body {
  p = (s32[], u8[8,128], u8[8,128], u8[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  g1 = u8[8,128] get-tuple-element(p), index=1
  g2 = u8[8,128] get-tuple-element(p), index=2
  g3 = u8[8,128] get-tuple-element(p), index=3
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  r = u8[1,128] slice(g3), slice={[0:1], [0:128]}
  z = s32[] constant(0)
  u = u8[8,128] dynamic-update-slice(g1, r, i, z)
  ROOT t = (s32[], u8[8,128], u8[8,128], u8[8,128]) tuple(i2, g2, g1, u)
}
cond {
  p = (s32[], u8[8,128], u8[8,128], u8[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  a = u8[8,128] parameter(0)
  b = u8[8,128] parameter(1)
  c = u8[8,128] parameter(2)
  i0 = s32[] constant(0)
  init = (s32[], u8[8,128], u8[8,128], u8[8,128]) tuple(i0, a, b, c)
  ROOT w = (s32[], u8[8,128], u8[8,128], u8[8,128]) while(init), condition=cond, body=body
}
"""

FIRST_WRITER = """
HloModule first_writer
body {
  p = (s32[], u8[8,128], u8[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  g1 = u8[8,128] get-tuple-element(p), index=1
  g2 = u8[8,128] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  c = u8[] constant(1)
  b = u8[8,128] broadcast(c), dimensions={}
  m = u8[8,128] subtract(g2, g1)
  r = u8[1,128] slice(b), slice={[0:1], [0:128]}
  z = s32[] constant(0)
  u = u8[8,128] dynamic-update-slice(b, r, i, z)
  ROOT t = (s32[], u8[8,128], u8[8,128]) tuple(i2, u, m)
}
cond {
  p = (s32[], u8[8,128], u8[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  a = u8[8,128] parameter(0)
  b = u8[8,128] parameter(1)
  i0 = s32[] constant(0)
  init = (s32[], u8[8,128], u8[8,128]) tuple(i0, a, b)
  ROOT w = (s32[], u8[8,128], u8[8,128]) while(init), condition=cond, body=body
}
"""


@pytest.mark.parametrize("text", [FORWARDED_STATE, FIRST_WRITER], ids=["forwarded", "first-writer"])
def test_in_place_updates_never_clobber_state_still_to_be_read(text: str) -> None:
    import numpy as np

    import tpusim
    from tpusim.api import load_program
    from tpusim.compiler.hlo.reference import evaluate

    rng = np.random.default_rng(3)
    n = len(load_program(text).entry_computation.parameters)
    inputs = [rng.integers(0, 256, (8, 128), dtype=np.uint8) for _ in range(n)]
    want = evaluate(load_program(text), inputs)
    got = tpusim.simulate(text, inputs).outputs
    for g, w in zip(got, want):
        assert np.array_equal(np.asarray(g), np.asarray(w))


RESIDENT = """
HloModule resident
ENTRY main {
  a = f32[64,128]{1,0:T(8,128)} parameter(0)
  b = f32[64,128]{1,0:T(8,128)S(1)} negate(a)
  c = f32[64,128]{1,0:T(8,128)S(1)} exponential(b)
  d = f32[64,128]{1,0:T(8,128)S(1)} negate(c)
  ROOT e = f32[64,128]{1,0:T(8,128)} exponential(d)
}
"""


def test_values_the_module_keeps_in_vmem_get_vmem_buffers_by_liveness() -> None:
    """S(1) values live in VMEM, placed by the same liveness rule from VMEM address 0; entry parameters and
    outputs stay in HBM."""
    size = 64 * 128 * 4
    module = assign_layouts(parse_module(RESIDENT), RULES, V5E).module
    buffers = assign_buffers(module, 1 << 30, 0, 1 << 20)
    a, b, c, d, e = (buffers.buffer("main", n) for n in "abcde")
    assert (a.space, e.space) == ("hbm", "hbm")
    assert (b.space, c.space, d.space) == ("vmem",) * 3
    assert d.offset == b.offset and c.offset != b.offset  # b is dead when d is made
    assert buffers.vmem_bytes == 2 * size
    assert buffers.hbm_bytes == 2 * size  # only a and e


def test_residents_that_do_not_fit_the_vmem_budget_move_to_hbm_largest_first() -> None:
    size = 64 * 128 * 4
    module = assign_layouts(parse_module(RESIDENT), RULES, V5E).module
    fits_one = assign_buffers(module, 1 << 30, 0, size)
    spaces = {n: fits_one.buffer("main", n).space for n in "bcd"}
    assert spaces == {"b": "vmem", "c": "hbm", "d": "hbm"}, spaces  # equal sizes: the latest move first
    assert fits_one.vmem_bytes == size
    none = assign_buffers(module, 1 << 30, 0, 0)
    assert {none.buffer("main", n).space for n in "bcd"} == {"hbm"} and none.vmem_bytes == 0


def test_an_instruction_gets_the_vmem_its_live_residents_leave() -> None:
    """Each instruction's own VMEM blocks start above the resident buffers live while it runs, not above the
    peak of all residents: the negation at the end, whose operand is the only resident left, blocks below the
    peak (on v6e the f32 decoder's MLP matmul had been left 64-row blocks by residents long dead, streaming
    its weights 128 times). Outputs equal the reference."""
    import tpusim
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.compiler.hlo.reference.io import random_inputs
    from tpusim.isa import Space

    text = """HloModule tops
ENTRY main {
  p = f32[1024,1024] parameter(0)
  w = f32[1024,1024] parameter(1)
  a = f32[1024,1024] dot(p, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  b = f32[1024,1024] dot(a, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  c = f32[1024,1024] dot(b, p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d = f32[1024,1024] add(a, c)
  e = f32[1024,1024] dot(d, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT f = f32[1024,1024] negate(e)
}"""
    module = parse_module(text)
    inputs = random_inputs(module, 2)[0]
    run = tpusim.simulate(module, inputs, config="tpu_v5e")
    buffers = run.compiled.buffers
    entry = run.compiled.module.entry
    assert buffers.vmem_top(entry, "e") < buffers.vmem_bytes and buffers.vmem_top(entry, "f") < buffers.vmem_bytes
    code = run.compiled.program.streams[0].instructions
    # (consecutive instructions take alternate halves of what is free: one of the two starts at its top)
    blocks = [i.dst.address for i in code if i.hlo in ("e", "f") and getattr(i, "dst", None) is not None
              and i.dst.space == Space.VMEM]  # fmt: skip
    assert blocks and min(blocks) < buffers.vmem_bytes
    want = np.asarray(evaluate(module, inputs)[0])
    np.testing.assert_allclose(np.asarray(run.outputs[0]), want, rtol=0, atol=2e-2 * np.abs(want).max())


WEIGHTS_SCAN = """HloModule weights_scan

body {
  s = (s32[], f32[64,256], f32[256,256]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  h = f32[64,256] get-tuple-element(s), index=1
  w = f32[256,256] get-tuple-element(s), index=2
  d = f32[64,256] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  n = f32[64,256] tanh(d)
  ROOT t = (s32[], f32[64,256], f32[256,256]) tuple(j, n, w)
}

cond {
  s = (s32[], f32[64,256], f32[256,256]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  k = s32[] constant(8)
  ROOT lt = pred[] compare(i, k), direction=LT
}

ENTRY main {
  h0 = f32[64,256] parameter(0)
  w0 = f32[256,256] parameter(1)
  z = s32[] constant(0)
  init = (s32[], f32[64,256], f32[256,256]) tuple(z, h0, w0)
  loop = (s32[], f32[64,256], f32[256,256]) while(init), condition=cond, body=body
  ROOT h = f32[64,256] get-tuple-element(loop), index=1
}
"""


def test_loop_state_stays_in_vmem_across_iterations() -> None:
    """A scan's carry and the weights it rides along stay in VMEM across the iterations (as XLA:TPU's compiled
    scans keep their state), copied in once before the loop, where each iteration re-read them from HBM; the
    carry the program returns is copied out once after the loop, to the HBM result. Outputs as the reference
    interpreter computes them."""
    import tpusim
    from tpusim.api import compile_checked
    from tpusim.compiler.hlo.reference import evaluate

    config = load_config("tpu_v5e")
    module = parse_module(WEIGHTS_SCAN)
    compiled = compile_checked(module, config)
    loop = compiled.module.entry_computation["loop"]
    spaces = [e.layout.memory_space if e.rank else None for e in loop.shape.elements]
    assert spaces == [None, 1, 1]  # (the counter is SMEM's)
    body = compiled.module["body"]
    assert body["w"].shape.layout.memory_space == 1 and body["n"].shape.layout.memory_space == 1
    assert [compiled.buffers.buffer("main", "loop", (k,)).space for k in (1, 2)] == ["vmem", "vmem"]
    out = compiled.module.entry_computation["h"]  # the result: the carry copied out of the loop state
    assert out.opcode == "copy" and compiled.buffers.buffer("main", "h").space == "hbm"
    rng = np.random.default_rng(0)
    inputs = [
        rng.standard_normal((64, 256)).astype(np.float32) * 0.1,
        rng.standard_normal((256, 256)).astype(np.float32) * 0.05,
    ]
    got = tpusim.simulate(compiled, inputs).outputs[0]
    want = evaluate(module, inputs)[0]
    np.testing.assert_allclose(got, want, atol=2e-2)  # (one bf16 pass per f32 dot, as XLA's DEFAULT on TPU)


def test_loop_state_stays_in_vmem_when_its_operand_is_in_hbm() -> None:
    """A loop whose operand dies at the loop takes the operand's buffer as its state; when that buffer is in
    HBM (here the results of a multi-output fusion, as the fusion pass makes of threefry's first round) the
    state stayed in HBM too: every iteration read it from there and copied the next state back HBM to HBM
    (dropout's threefry loop, 5 iterations: 2 us of its 50). The state is copied into VMEM once instead.
    Outputs as the reference interpreter computes them."""
    import tpusim
    from tpusim.api import compile_checked
    from tpusim.compiler.hlo.reference import evaluate

    text = WEIGHTS_SCAN.replace(
        "ENTRY main {\n  h0 = f32[64,256] parameter(0)\n  w0 = f32[256,256] parameter(1)\n",
        "both {\n  p = f32[64,256] parameter(0)\n  q = f32[256,256] parameter(1)\n  n = f32[64,256] negate(p)\n"
        "  e = f32[256,256] exponential(q)\n  ROOT t = (f32[64,256], f32[256,256]) tuple(n, e)\n}\n\n"
        "ENTRY main {\n  a = f32[64,256] parameter(0)\n  b = f32[256,256] parameter(1)\n"
        "  f = (f32[64,256], f32[256,256]) fusion(a, b), kind=kLoop, calls=both\n"
        "  h0 = f32[64,256] get-tuple-element(f), index=0\n  w0 = f32[256,256] get-tuple-element(f), index=1\n",
    )
    module = parse_module(text)
    compiled = compile_checked(module, load_config("tpu_v5e"))
    assert [compiled.buffers.buffer("main", "loop", (k,)).space for k in (1, 2)] == ["vmem", "vmem"]
    rng = np.random.default_rng(0)
    inputs = [
        rng.standard_normal((64, 256)).astype(np.float32) * 0.1,
        rng.standard_normal((256, 256)).astype(np.float32) * 0.05,
    ]
    got = tpusim.simulate(compiled, inputs).outputs[0]
    want = evaluate(module, inputs)[0]
    np.testing.assert_allclose(got, want, atol=2e-2)


def test_values_a_tuple_forwards_stay_in_vmem() -> None:
    """A tuple and the elements taken from it forward their operands' buffers (an inlined call's results, a
    multi-output fusion's): they take their operands' memory, so the values stay on chip (they went to HBM
    when the tuple kept the default memory: the corpus GRU's new carry, the train step's results)."""
    from tpusim.api import compile_checked

    text = """HloModule forward
ENTRY main {
  a = f32[64,128] parameter(0)
  b = f32[64,128] negate(a)
  c = f32[64,128] exponential(a)
  t = (f32[64,128], f32[64,128]) tuple(b, c)
  g0 = f32[64,128] get-tuple-element(t), index=0
  g1 = f32[64,128] get-tuple-element(t), index=1
  ROOT r = f32[64,128] add(g0, g1)
}
"""
    compiled = compile_checked(parse_module(text), V5E)
    spaces = {v: compiled.buffers.buffer("main", v).space for v in ("b", "g0", "g1", "r")}
    assert spaces == {"b": "vmem", "g0": "vmem", "g1": "vmem", "r": "hbm"}


def test_scalar_arguments_are_read_from_smem() -> None:
    """``x[i:i+16, j:j+32]`` with JAX's wrapping of negative indices: the index arithmetic on the two s32
    arguments ran as a DMA from HBM and a vector instruction per operation (6.6 us for the whole program).
    Each argument is copied into SMEM once and the arithmetic runs on the scalar unit: no vector
    instruction touches a scalar, the program matches JAX, and it takes under a third of the time."""
    import jax

    import tpusim
    from tpusim.isa import ScalarAlu, VpuMap

    def dslice(x: object, i: object, j: object) -> object:
        return jax.lax.dynamic_slice(x, (i, j), (16, 32))

    x = np.arange(64 * 100, dtype=np.float32).reshape(64, 100)
    i, j = np.int32(-10), np.int32(3)
    result = tpusim.simulate_jax(dslice, x, i, j)
    np.testing.assert_array_equal(np.asarray(result.tree), np.asarray(jax.jit(dslice)(x, i, j)))
    stream = result.compiled.program.streams[0].instructions
    assert not [s for s in stream if isinstance(s, VpuMap) and s.dst.shape.rank == 0]
    assert [s for s in stream if isinstance(s, ScalarAlu)]
    assert result.seconds < 2.5e-6, result.seconds


def test_an_element_taken_as_an_integer_scalar_is_an_smem_word() -> None:
    """Threefry's rotation amounts: one element of a small u32 array, reshaped to a scalar, ``32 - r``
    on it, both broadcast into shifts. The scalar shared the array's buffer (rank 1, in HBM), so the
    subtraction ran on the vector unit and each value took DMA round trips through HBM (2,400 cycles a
    rotation); the scalar is an SMEM word of its own, computed on by the scalar unit. Outputs as the
    reference interpreter computes them."""
    import tpusim
    from tpusim.api import compile_checked
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.isa import ScalarAlu

    text = """HloModule rotate
ENTRY main {
  x = u32[64,512] parameter(0)
  rot = u32[4] parameter(1)
  r1 = u32[1] slice(rot), slice={[1:2]}
  r = u32[] reshape(r1)
  c32 = u32[] constant(32)
  l = u32[] subtract(c32, r)
  rb = u32[64,512] broadcast(r), dimensions={}
  lb = u32[64,512] broadcast(l), dimensions={}
  a = u32[64,512] shift-left(x, rb)
  b = u32[64,512] shift-right-logical(x, lb)
  ROOT o = u32[64,512] or(a, b)
}
"""
    module = parse_module(text)
    compiled = compile_checked(module, V5E)
    assert compiled.buffers.buffer("main", "r").space == "smem"
    assert compiled.buffers.buffer("main", "l").space == "smem"
    code = compiled.program.streams[0].instructions
    assert [i.fn for i in code if isinstance(i, ScalarAlu) and i.hlo == "l"] == ["sub"]
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 2**32, (64, 512), dtype=np.uint32), np.array([13, 15, 26, 6], np.uint32)]
    got = tpusim.simulate(compiled, inputs).outputs[0]
    np.testing.assert_array_equal(got, evaluate(module, inputs)[0])


def test_a_multi_output_fusions_results_stay_in_vmem() -> None:
    """The results of a multi-output fusion are intermediates like a single result: kept in VMEM (they went
    to HBM, written there and read back by the next kernel: 2,200 cycles of each threefry round)."""
    from tpusim.api import compile_checked
    from tpusim.compiler.options import CompileOptions

    text = """HloModule multi
both {
  p = f32[64,128] parameter(0)
  n = f32[64,128] negate(p)
  e = f32[64,128] exponential(p)
  ROOT t = (f32[64,128], f32[64,128]) tuple(n, e)
}

ENTRY main {
  a = f32[64,128] parameter(0)
  f = (f32[64,128], f32[64,128]) fusion(a), kind=kLoop, calls=both
  g0 = f32[64,128] get-tuple-element(f), index=0
  g1 = f32[64,128] get-tuple-element(f), index=1
  ROOT r = f32[64,128] multiply(g0, g1)
}
"""
    compiled = compile_checked(parse_module(text), V5E, options=CompileOptions(fuse=False))
    spaces = {v: compiled.buffers.buffer("main", v).space for v in ("g0", "g1", "r")}
    assert spaces == {"g0": "vmem", "g1": "vmem", "r": "hbm"}


def test_a_loop_state_kept_in_vmem_is_rotated_through_vmem() -> None:
    """``(i, a, b) -> (i + 1, b, a)`` with ``a`` and ``b`` kept in VMEM: the end of each iteration saves one
    of them before the swap; the temporary was in HBM (two HBM latencies per iteration of threefry's loop,
    which rotates two u32[4] tables), and is now in VMEM. After the loop its elements were copied out to HBM
    and read back from there. Outputs as the reference interpreter's."""
    import tpusim
    from tpusim.api import compile_checked
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.isa import DmaStart, Space

    text = """HloModule rotate
cond {
  s = (s32[], f32[8,128], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[8,128], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  a = f32[8,128] get-tuple-element(s), index=1
  b = f32[8,128] get-tuple-element(s), index=2
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT t = (s32[], f32[8,128], f32[8,128]) tuple(i2, b, a)
}
ENTRY main {
  a = f32[8,128] parameter(0)
  b = f32[8,128] parameter(1)
  z = s32[] constant(0)
  t = (s32[], f32[8,128], f32[8,128]) tuple(z, a, b)
  w = (s32[], f32[8,128], f32[8,128]) while(t), condition=cond, body=body
  x = f32[8,128] get-tuple-element(w), index=1
  y = f32[8,128] get-tuple-element(w), index=2
  ROOT r = f32[8,128] subtract(x, y)
}
"""
    module = parse_module(text)
    compiled = compile_checked(module, V5E)
    assert [compiled.buffers.buffer("main", "w", (k,)).space for k in (1, 2)] == ["vmem", "vmem"]
    # (the elements read after the loop, not program results, are read where the loop left them: no copy out)
    assert [compiled.module.entry_computation[v].opcode for v in "xy"] == ["get-tuple-element"] * 2
    assert [compiled.buffers.buffer("main", v).space for v in "xy"] == ["vmem", "vmem"]
    swaps = [i for i in compiled.program.streams[0].instructions if isinstance(i, DmaStart) and i.hlo == "w"]
    assert swaps and all(Space.HBM not in (i.src.space, i.dst.space) for i in swaps[-3:]), swaps
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((8, 128)).astype(np.float32) for _ in range(2)]
    got = tpusim.simulate(compiled, inputs).outputs[0]
    np.testing.assert_array_equal(got, evaluate(module, inputs)[0])


def test_a_result_kept_in_vmem_is_computed_where_it_lives() -> None:
    """A vector kernel whose result is resident in VMEM stores its blocks there, as a kernel's output block
    is the next kernel's input: it computed them into a buffer of its own and copied that by DMA, a copy as
    long as the computation (each threefry round's results). Outputs as the reference interpreter's."""
    import tpusim
    from tpusim.api import compile_checked
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.compiler.options import CompileOptions
    from tpusim.isa import DmaStart, VpuMap

    text = """HloModule resident
ENTRY main {
  a = f32[64,512] parameter(0)
  b = f32[64,512] negate(a)
  c = f32[64,512] exponential(b)
  ROOT d = f32[64,512] add(b, c)
}
"""
    module = parse_module(text)
    compiled = compile_checked(module, V5E, options=CompileOptions(fuse=False))
    home = compiled.buffers.buffer("main", "c")
    assert home.space == "vmem"
    code = compiled.program.streams[0].instructions
    assert not [i for i in code if isinstance(i, DmaStart) and i.hlo == "c"]
    assert [i.dst.address for i in code if isinstance(i, VpuMap) and i.hlo == "c"] == [home.offset]
    inputs = [np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)]
    got = tpusim.simulate(compiled, inputs).outputs[0]
    np.testing.assert_allclose(got, evaluate(module, inputs)[0], rtol=1e-6)


def test_an_element_taken_as_a_scalar_is_one_dma() -> None:
    """XLA's modules take threefry's rotation amounts as ``bitcast``s of ``u32[1]{0:T(128)}`` arrays in HBM;
    the SMEM word of such a scalar is one DMA of the element's bytes (it went through an untiled HBM scratch
    buffer: two dependent DMAs, an HBM latency each)."""
    import tpusim
    from tpusim.api import compile_checked
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.isa import DmaStart, Space

    text = """HloModule taken
ENTRY main {
  x = u32[8,128]{1,0:T(8,128)} parameter(0)
  k = u32[1]{0:T(128)} parameter(1)
  r = u32[]{:T(128)} bitcast(k)
  c = u32[]{:T(128)} constant(32)
  l = u32[]{:T(128)} subtract(c, r)
  lb = u32[8,128]{1,0:T(8,128)} broadcast(l), dimensions={}
  ROOT o = u32[8,128]{1,0:T(8,128)} shift-right-logical(x, lb)
}
"""
    module = parse_module(text)
    compiled = compile_checked(module, V5E)
    moves = [i for i in compiled.program.streams[0].instructions if i.hlo == "r"]
    assert len(moves) == 2 and isinstance(moves[0], DmaStart) and moves[0].dst.space is Space.SMEM, moves
    inputs = [np.arange(1024, dtype=np.uint32).reshape(8, 128) * 77777, np.array([19], np.uint32)]
    got = tpusim.simulate(compiled, inputs).outputs[0]
    np.testing.assert_array_equal(got, evaluate(module, inputs)[0])


def test_values_an_optimization_barrier_passes_stay_in_vmem() -> None:
    """``jax.checkpoint`` puts its saved values through an ``opt-barrier``: the barrier forwards them (one
    buffer), so it takes their memory; it kept the default memory and took them to HBM (each layer's
    activation of a rematerialised MLP's gradient written there and read back)."""
    from tpusim.api import compile_checked

    text = """HloModule barrier
ENTRY main {
  a = f32[64,128] parameter(0)
  b = f32[64,128] exponential(a)
  t = (f32[64,128], f32[64,128]) tuple(a, b)
  o = (f32[64,128], f32[64,128]) opt-barrier(t)
  g = f32[64,128] get-tuple-element(o), index=1
  ROOT r = f32[64,128] negate(g)
}
"""
    compiled = compile_checked(parse_module(text), V5E)
    assert {v: compiled.buffers.buffer("main", v).space for v in ("b", "g", "r")} == {
        "b": "vmem",
        "g": "vmem",
        "r": "hbm",
    }


def test_a_loop_state_element_a_result_reshapes_stays_in_vmem() -> None:
    """An accumulator the program returns through a reshape (a gradient scan's result, flattened): the
    reshape shares the element's buffer, so reading the element where the loop left it would make the
    loop's state the program's output, in HBM, for every iteration (an LSTM's gradient: 228 -> 548 us).
    Such an element is still copied out once after the loop."""
    from tpusim.api import compile_checked

    text = """HloModule acc

body {
  s = (s32[], f32[128,128]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  a = f32[128,128] get-tuple-element(s), index=1
  e = f32[128,128] exponential(a)
  ROOT t = (s32[], f32[128,128]) tuple(j, e)
}

cond {
  s = (s32[], f32[128,128]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[128,128] parameter(0)
  z = s32[] constant(0)
  y = f32[128,128] negate(x)
  init = (s32[], f32[128,128]) tuple(z, y)
  w = (s32[], f32[128,128]) while(init), condition=cond, body=body
  g = f32[128,128] get-tuple-element(w), index=1
  ROOT r = f32[16384] reshape(g)
}
"""
    compiled = compile_checked(parse_module(text), V5E)
    assert compiled.buffers.buffer("main", "w", (1,)).space == "vmem"
    assert compiled.buffers.buffer("main", "r").space == "hbm"


def test_scalar_arguments_are_copied_into_smem_together() -> None:
    """JAX declares each parameter where it is first used, so a scalar argument's SMEM copy was waited for
    (its user came next) before the next argument's started: one HBM latency per scalar argument, in series
    (``lax.switch`` on one and ``lax.cond`` on another: 4.68 -> 4.28 us on v5e). The parameters come first
    and their copies' DMAs are in flight together, one wait for both."""
    from tpusim.api import compile_checked
    from tpusim.isa import DmaStart, SemWait

    text = """HloModule two_scalars
ENTRY main {
  a = s32[] parameter(0)
  z = s32[] constant(0)
  p = pred[] compare(a, z), direction=GT
  q = s32[] convert(p)
  b = s32[] parameter(1)
  ROOT s = s32[] add(q, b)
}
"""
    compiled = compile_checked(parse_module(text), V5E)
    code = compiled.program.streams[0].instructions
    first_wait = next(k for k, i in enumerate(code) if isinstance(i, SemWait))
    assert sum(isinstance(i, DmaStart) for i in code[:first_wait]) == 2
