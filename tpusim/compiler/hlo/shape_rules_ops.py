"""Shape rules of the opcodes with dimension numbers or called computations: reductions and windows,
dot and convolution, gather and scatter, sort, fft and linear algebra, calls and control flow,
collectives, async ops and host transfers. Registered into ``shape_rules.SHAPE_RULES`` on import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

from tpusim.compiler.hlo.ir import Instruction, Module, Window
from tpusim.compiler.hlo.shape_rules import (
    RuleError,
    _array,
    _dim_list,
    _dims,
    _exact,
    _group_size,
    _result_dims,
    _same,
    _scalar,
    _scalar_of,
    _signature,
    _tuple,
    _window_out,
    compatible,
    make_shape,
    rule,
)
from tpusim.memory import AnyShape, Shape, TupleShape, element_type

__all__: list[str] = []


def _variadic_result(ins: Instruction, shapes: Sequence[AnyShape], because: str | Callable[[], str]) -> None:
    _same(ins, shapes[0] if len(shapes) == 1 else TupleShape(tuple(shapes)), because)


# ---------------------------------------------------------------------------------------------
# reductions and windows
# ---------------------------------------------------------------------------------------------
@rule("reduce")
def _reduce(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    if len(ops) % 2:
        raise RuleError(f"reduce needs N inputs and N init values, found {len(ops)} operands")
    n = len(ops) // 2
    inputs = [_array(s, f"input {i}") for i, s in enumerate(ops[:n])]
    inits = [_scalar(s, f"init value {i}") for i, s in enumerate(ops[n:])]
    dims = ins.attr("dimensions", ())
    _dim_list(dims, inputs[0].rank, "dimensions", of=inputs[0])
    for x in inputs[1:]:
        if x.dimensions != inputs[0].dimensions:
            raise RuleError(f"reduce inputs {inputs[0]} and {x} have different dimensions")
    kept = tuple(d for i, d in enumerate(inputs[0].dimensions) if i not in dims)
    _variadic_result(
        ins, [make_shape(init.element_type, kept) for init in inits], lambda: f"reduce of {inputs[0]} over {list(dims)}"
    )
    _signature(
        module, ins.attr("to_apply"), [*inits, *inits], inits[0] if n == 1 else TupleShape(tuple(inits)), "the to_apply"
    )


@rule("reduce-window")
def _reduce_window(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    if len(ops) % 2:
        raise RuleError(f"reduce-window needs N inputs and N init values, found {len(ops)} operands")
    n = len(ops) // 2
    inputs = [_array(s, f"input {i}") for i, s in enumerate(ops[:n])]
    inits = [_scalar(s, f"init value {i}") for i, s in enumerate(ops[n:])]
    window = ins.attr("window", Window(()))
    x = inputs[0]
    if len(window.dims) != x.rank:
        raise RuleError(f"the window has {len(window.dims)} dimensions but the input {x} has {x.rank}")
    out = tuple(_window_out(d, w) for d, w in zip(x.dimensions, window.dims))
    _variadic_result(ins, [make_shape(init.element_type, out) for init in inits], lambda: f"reduce-window of {x}")
    _signature(module, ins.attr("to_apply"), [*inits, *inits], "scalars", "the to_apply")


@rule("select-and-scatter")
def _select_and_scatter(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x, source = _array(ops[0], "the operand"), _array(ops[1], "the source")
    init = _scalar(ops[2], "the init value")
    window = ins.attr("window", Window(()))
    if len(window.dims) != x.rank:
        raise RuleError(f"the window has {len(window.dims)} dimensions but the operand {x} has {x.rank}")
    windows = tuple(_window_out(d, w) for d, w in zip(x.dimensions, window.dims))
    if source.dimensions != windows:
        raise RuleError(f"source {source} should have the window count {_dims(windows)} of {x}")
    _same(ins, x, lambda: f"select-and-scatter keeps the shape of {x}")
    scalar = _scalar_of(x)
    _signature(module, ins.attr("select"), [scalar, scalar], make_shape(element_type("pred"), ()), "the select")
    _signature(module, ins.attr("scatter"), [init, init], init, "the scatter")


@rule("map")
def _map(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    arrays = [_array(s, f"operand {i}") for i, s in enumerate(ops)]
    for a in arrays[1:]:
        if a.dimensions != arrays[0].dimensions:
            raise RuleError(f"map operands {arrays[0]} and {a} have different dimensions")
    _result_dims(ins, arrays[0].dimensions, "map keeps the dimensions")
    _signature(module, ins.attr("to_apply"), [_scalar_of(a) for a in arrays], "scalars", "the to_apply")


@rule("sort")
def _sort(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    arrays = [_array(s, f"operand {i}") for i, s in enumerate(ops)]
    for a in arrays[1:]:
        if a.dimensions != arrays[0].dimensions:
            raise RuleError(f"sort operands {arrays[0]} and {a} have different dimensions")
    _dim_list(ins.attr("dimensions", ())[:1], arrays[0].rank, "dimensions", of=arrays[0])
    _variadic_result(ins, arrays, "sort keeps its operands' shapes")
    scalars = [s for a in arrays for s in (_scalar_of(a), _scalar_of(a))]
    _signature(module, ins.attr("to_apply"), scalars, make_shape(element_type("pred"), ()), "the comparator")


@rule("topk")
def _topk(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    k = ins.attr("k", 0)
    if not x.rank or not 0 <= k <= x.dimensions[-1]:
        raise RuleError(f"k={k} does not fit the last dimension of {x}")
    dims = (*x.dimensions[:-1], k)
    _same(
        ins,
        TupleShape((make_shape(x.element_type, dims), make_shape(element_type("s32"), dims))),
        lambda: f"top-{k} of {x}",
    )


# ---------------------------------------------------------------------------------------------
# dot, convolution, gather, scatter
# ---------------------------------------------------------------------------------------------
def _dot_dims(ins: Instruction, lhs: Shape, rhs: Shape) -> tuple[int, ...]:
    lb, rb = ins.attr("lhs_batch_dims", ()), ins.attr("rhs_batch_dims", ())
    lc, rc = ins.attr("lhs_contracting_dims", ()), ins.attr("rhs_contracting_dims", ())
    _dim_list((*lb, *lc), lhs.rank, "lhs batch and contracting dimensions", of=lhs)
    _dim_list((*rb, *rc), rhs.rank, "rhs batch and contracting dimensions", of=rhs)
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise RuleError(f"lhs and rhs list different numbers of batch or contracting dimensions ({lhs} . {rhs})")
    for kind, ls, rs in (("batch", lb, rb), ("contracting", lc, rc)):
        for a, b in zip(ls, rs):
            if lhs.dimensions[a] != rhs.dimensions[b]:
                raise RuleError(f"{kind} dimension {a} of lhs {lhs} and {b} of rhs {rhs} have different sizes")
    free_l = [d for i, d in enumerate(lhs.dimensions) if i not in lb and i not in lc]
    free_r = [d for i, d in enumerate(rhs.dimensions) if i not in rb and i not in rc]
    return (*(lhs.dimensions[i] for i in lb), *free_l, *free_r)


@rule("dot")
def _dot(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    lhs, rhs = _array(ops[0], "the lhs"), _array(ops[1], "the rhs")
    _result_dims(ins, _dot_dims(ins, lhs, rhs), lambda: f"dot of lhs {lhs} and rhs {rhs}: batch, lhs free, rhs free")


@rule("scaled-dot")
def _scaled_dot(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    lhs, rhs = _array(ops[0], "the lhs"), _array(ops[2], "the rhs")
    _result_dims(ins, _dot_dims(ins, lhs, rhs), lambda: f"scaled dot of lhs {lhs} and rhs {rhs}")


@rule("convolution")
def _convolution(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    lhs, rhs = _array(ops[0], "the input"), _array(ops[1], "the kernel")
    d = ins.attr("dim_labels")
    n = len(d.input_spatial)
    if lhs.rank != n + 2 or rhs.rank != n + 2:
        raise RuleError(f"dim_labels describe {n} spatial dimensions but input is {lhs} and kernel is {rhs}")
    window = ins.attr("window", Window(()))
    if len(window.dims) != n:
        raise RuleError(f"the window has {len(window.dims)} dimensions for {n} spatial dimensions")
    fgc, bgc = ins.attr("feature_group_count", 1), ins.attr("batch_group_count", 1)
    in_features = lhs.dimensions[d.input_feature]
    if in_features != rhs.dimensions[d.kernel_input_feature] * fgc:
        raise RuleError(
            f"input features {in_features} of {lhs} != kernel input features "
            f"{rhs.dimensions[d.kernel_input_feature]} x feature_group_count {fgc} ({rhs})"
        )
    for w, k in zip(window.dims, d.kernel_spatial):
        if w.size != rhs.dimensions[k]:
            raise RuleError(f"window size {w.size} differs from kernel spatial size {rhs.dimensions[k]} of {rhs}")
    out = [0] * (n + 2)
    out[d.output_batch] = lhs.dimensions[d.input_batch] // bgc
    out[d.output_feature] = rhs.dimensions[d.kernel_output_feature]
    for i in range(n):
        out[d.output_spatial[i]] = _window_out(lhs.dimensions[d.input_spatial[i]], window.dims[i])
    _result_dims(ins, out, lambda: f"convolution of {lhs} with {rhs}")


@rule("gather")
def _gather(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x, idx = _array(ops[0], "the operand"), _array(ops[1], "the start indices")
    offset_dims, collapsed = ins.attr("offset_dims", ()), ins.attr("collapsed_slice_dims", ())
    batching, sizes = ins.attr("operand_batching_dims", ()), ins.attr("slice_sizes", ())
    ivd = ins.attr("index_vector_dim", idx.rank)
    if len(sizes) != x.rank or any(not 0 <= s <= d for s, d in zip(sizes, x.dimensions)):
        raise RuleError(f"slice_sizes={list(sizes)} do not fit the operand {x}")
    _dim_list((*collapsed, *batching), x.rank, "collapsed_slice_dims and operand_batching_dims", of=x)
    if not 0 <= ivd <= idx.rank:
        raise RuleError(f"index_vector_dim={ivd} is out of range for the indices {idx}")
    start_map = ins.attr("start_index_map", ())
    _dim_list(start_map, x.rank, "start_index_map", of=x)
    _index_vector(idx, ivd, start_map, "start_index_map")
    batch = [d for i, d in enumerate(idx.dimensions) if i != ivd]
    offsets = [s for i, s in enumerate(sizes) if i not in collapsed and i not in batching]
    if len(offset_dims) != len(offsets):
        raise RuleError(
            f"offset_dims={list(offset_dims)} should list {len(offsets)} dimensions (slice_sizes "
            f"{list(sizes)} without the collapsed and batching ones)"
        )
    rank = len(batch) + len(offsets)
    _dim_list(offset_dims, rank, "offset_dims")
    out, b, o = [], iter(batch), iter(offsets)
    for i in range(rank):
        out.append(next(o) if i in offset_dims else next(b))
    _result_dims(ins, out, lambda: f"gather from {x} at {idx}")


def _index_vector(idx: Shape, ivd: int, mapped: Sequence[int], what: str) -> None:
    """The index vector (dimension ``ivd`` of the indices, or a trailing 1) holds one start per entry of
    ``what``."""
    length = idx.dimensions[ivd] if ivd < idx.rank else 1
    if length != len(mapped):
        raise RuleError(
            f"the indices {idx} hold {length} starts per index vector but {what}={list(mapped)} maps {len(mapped)}"
        )


@rule("scatter")
def _scatter(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    if len(ops) % 2 == 0:
        raise RuleError(f"scatter needs N operands, the indices and N updates, found {len(ops)} operands")
    n = len(ops) // 2
    operands = [_array(s, f"operand {i}") for i, s in enumerate(ops[:n])]
    idx = _array(ops[n], "the scatter indices")
    updates = [_array(s, f"update {i}") for i, s in enumerate(ops[n + 1 :])]
    window = ins.attr("update_window_dims", ())
    ivd = ins.attr("index_vector_dim", idx.rank)
    if not 0 <= ivd <= idx.rank:
        raise RuleError(f"index_vector_dim={ivd} is out of range for the indices {idx}")
    to_operand = ins.attr("scatter_dims_to_operand_dims", ())
    inserted = (*ins.attr("inserted_window_dims", ()), *ins.attr("input_batching_dims", ()))
    for x in operands:
        _dim_list(to_operand, x.rank, "scatter_dims_to_operand_dims", of=x)
        _dim_list(inserted, x.rank, "inserted_window_dims and input_batching_dims", of=x)
    _index_vector(idx, ivd, to_operand, "scatter_dims_to_operand_dims")
    scatter_dims = idx.rank - (1 if ivd < idx.rank else 0)
    for u in updates:
        if u.rank != len(window) + scatter_dims:
            raise RuleError(
                f"update {u} should have rank {len(window) + scatter_dims} (update_window_dims "
                f"{list(window)} plus the scatter dimensions of {idx})"
            )
    for u in updates:
        _dim_list(window, u.rank, "update_window_dims", of=u)
    _variadic_result(ins, operands, "scatter keeps its operands' shapes")
    scalars = [_scalar_of(u) for u in operands]
    _signature(module, ins.attr("to_apply"), [*scalars, *scalars], "scalars", "the to_apply")


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------
@rule("fft")
def _fft(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    kind, length = ins.attr("fft_type"), tuple(ins.attr("fft_length", ()))
    n = len(length)
    if x.rank < n:
        raise RuleError(f"fft_length={list(length)} has more dimensions than the operand {x}")
    dims = list(x.dimensions)
    if kind == "RFFT":
        if tuple(dims[-n:]) != length:
            raise RuleError(f"RFFT of {x} needs its last dimensions to be fft_length={list(length)}")
        dims[-1] = length[-1] // 2 + 1
    elif kind == "IRFFT":
        if tuple(dims[-n:-1]) != length[:-1] or dims[-1] != length[-1] // 2 + 1:
            raise RuleError(
                f"IRFFT of {x} to fft_length={list(length)} needs last dimensions "
                f"{_dims((*length[:-1], length[-1] // 2 + 1))}"
            )
        dims[-1] = length[-1]
    elif kind not in ("FFT", "IFFT"):
        raise RuleError(f"fft_type={kind} is not FFT, IFFT, RFFT or IRFFT")
    elif tuple(dims[len(dims) - n :]) != length:
        raise RuleError(f"{kind} of {x} needs its last dimensions to be fft_length={list(length)}")
    _result_dims(ins, dims, lambda: f"{kind} of {x}")


@rule("triangular-solve")
def _triangular_solve(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    a, b = _array(ops[0], "a"), _array(ops[1], "b")
    if a.rank < 2 or a.dimensions[-1] != a.dimensions[-2] or b.rank != a.rank:
        raise RuleError(f"triangular-solve needs square matrices a {a} and b {b} of the same rank")
    m = b.dimensions[-2] if ins.attr("left_side", False) else b.dimensions[-1]
    if m != a.dimensions[-1]:
        raise RuleError(f"a {a} does not match b {b} on the {'left' if ins.attr('left_side') else 'right'} side")
    _same(ins, b, "triangular-solve gives a result of b's shape")


@rule("batch-norm-training", "batch-norm-grad")
def _batch_norm_tuple(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    f = ins.attr("feature_index", -1)
    if not 0 <= f < x.rank:
        raise RuleError(f"feature_index={f} is not a dimension of {x}")
    feature = make_shape(x.element_type, (x.dimensions[f],))
    _same(ins, TupleShape((x, feature, feature)), lambda: f"{ins.opcode} of {x}")


@rule("batch-norm-inference")
def _batch_norm_inference(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _same(ins, _array(ops[0], "the operand"), "batch-norm-inference keeps the operand's shape")


@rule("rng")
def _rng(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    for i, s in enumerate(ops):
        _scalar(s, f"rng parameter {i}")
    _array(ins.shape, "the result")


@rule("rng-bit-generator")
def _rng_bit_generator(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    if isinstance(ins.shape, Shape):  # the bits alone: XLA:TPU's compiled form when the new state is unused
        return
    out = _tuple(ins.shape, "the result of rng-bit-generator", 2)
    if not compatible(out.elements[0], ops[0]):
        raise RuleError(f"the new state {out.elements[0]} should have the shape of the state {ops[0]}")


# ---------------------------------------------------------------------------------------------
# calls and control flow
# ---------------------------------------------------------------------------------------------
@rule("call", "fusion")
def _call(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    callee = ins.attr("to_apply" if ins.opcode == "call" else "calls")
    _signature(module, callee, ops, None, f"the {ins.opcode}'s", exact=True)  # (XLA: operands = parameters)
    _signature(module, callee, len(ops), ins.shape, f"the {ins.opcode}'s", exact=ins.opcode == "call")


@rule("while")
def _while(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _exact(ins, ops[0], "while returns its loop state")
    pred = make_shape(element_type("pred"), ())
    _signature(module, ins.attr("condition"), [ops[0]], pred, "the condition", exact=True)
    _signature(module, ins.attr("body"), [ops[0]], ops[0], "the body", exact=True)


@rule("conditional")
def _conditional(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    index = _scalar(ops[0], "the branch index")
    branches = ins.attr("branch_computations")
    pair = (ins.attr("true_computation"), ins.attr("false_computation"))
    if index.element_type.name == "pred":
        if branches is not None or None in pair:
            raise RuleError("a pred-indexed conditional needs true_computation and false_computation")
        branches = pair
    elif index.element_type.name == "s32":
        if branches is None or pair != (None, None):
            raise RuleError("an s32-indexed conditional needs branch_computations")
    else:
        raise RuleError(f"the branch index must be pred or s32, not {index}")
    if len(branches) != len(ops) - 1:
        raise RuleError(f"{len(branches)} branches need {len(branches)} branch operands, found {len(ops) - 1}")
    for i, name in enumerate(branches):
        _signature(module, name, [ops[i + 1]], ins.shape, f"branch {i}", exact=True)


@rule("async-start")
def _async_start(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    from tpusim.compiler.hlo.shape_rules import SHAPE_RULES

    out = _tuple(ins.shape, "the result of async-start", 2)
    wrapped = ins.async_wrapped_instruction()
    if wrapped is not None:
        check = SHAPE_RULES.get(wrapped.opcode)
        if check is not None:
            check(wrapped, ops, module)
        return
    _signature(module, ins.attr("calls"), ops, out.elements[1], "the async")


@rule("async-done")
def _async_done(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    started = _tuple(ops[0], "the operand of async-done (an async-start's value)", 2)
    _same(ins, started.elements[1], "async-done gives the async computation's result")


# ---------------------------------------------------------------------------------------------
# collectives and transfers
# ---------------------------------------------------------------------------------------------
def _reducer(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    scalars = [_scalar_of(_array(s, "an operand")) for s in ops]
    _signature(module, ins.attr("to_apply"), [*scalars[:1], *scalars[:1]], "scalars", "the to_apply")


@rule("all-reduce", "all-reduce-start")
def _all_reduce(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _variadic_result(ins, ops, lambda: f"{ins.opcode} keeps its operands' shapes")
    _reducer(ins, ops, module)


def _scaled(ins: Instruction, x: Shape, factor: float) -> tuple[int, ...] | None:
    (d,) = ins.attr("dimensions", (0,))[:1]
    if not 0 <= d < x.rank:
        raise RuleError(f"dimensions={list(ins.attr('dimensions', ()))} is not a dimension of {x}")
    size = x.dimensions[d] * factor
    if size != int(size):
        raise RuleError(f"dimension {d} of {x} does not split into the replica group size {int(1 / factor)}")
    return tuple(int(size) if i == d else s for i, s in enumerate(x.dimensions))


@rule("all-gather", "reduce-scatter")
def _gather_scatter(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    n = _group_size(ins)
    results = ins.shape.elements if isinstance(ins.shape, TupleShape) and len(ops) > 1 else (ins.shape,)
    if len(results) != len(ops):
        raise RuleError(f"{ins.opcode} of {len(ops)} operands should give {len(ops)} results, found {ins.shape}")
    for x, out in zip(ops, results):
        x, out = _array(x, "an operand"), _array(out, "a result")
        _dim_list(ins.attr("dimensions", (0,))[:1], x.rank, "dimensions", of=x)
        if n is None:
            if out.rank != x.rank:
                raise RuleError(f"{ins.opcode} of {x} cannot give {out}")
            continue
        want = _scaled(ins, x, n if ins.opcode == "all-gather" else 1 / n)
        if out.dimensions != want:
            raise RuleError(
                f"{ins.opcode} of {x} over groups of {n} should give dimensions {_dims(want or ())}, found {out}"
            )
    if ins.opcode == "reduce-scatter":
        _reducer(ins, ops, module)


@rule("all-gather-start")
def _all_gather_start(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _tuple(ins.shape, "the result of all-gather-start", 2)


@rule("all-gather-done", "copy-done")
def _done_of_pair(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    started = _tuple(ops[0], f"the operand of {ins.opcode}", 2)
    index = 1 if ins.opcode == "all-gather-done" else 0
    _same(ins, started.elements[index], lambda: f"{ins.opcode} gives element {index} of {started}")


@rule("copy-start")
def _copy_start(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    out = _tuple(ins.shape, "the result of copy-start", 2)
    for i in (0, 1):
        if not compatible(out.elements[i], ops[0]):
            raise RuleError(f"element {i} of copy-start's {out} should have the operand's shape {ops[0]}")


@rule("all-to-all")
def _all_to_all(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    if len(ops) > 1:
        _variadic_result(ins, ops, "a tuple all-to-all keeps its operands' shapes")
        return
    x, out = _array(ops[0], "the operand"), _array(ins.shape, "the result")
    if prod(x.dimensions) != prod(out.dimensions) or x.element_type != out.element_type:
        raise RuleError(f"all-to-all of {x} cannot give {out}")


@rule("collective-permute", "collective-permute-start")
def _collective_permute(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    if ins.opcode == "collective-permute" and len(ops) == 1:
        _same(ins, ops[0], "collective-permute keeps its operand's shape")
    for pair in ins.attr("source_target_pairs", ()):
        if min(pair) < 0:
            raise RuleError(f"source_target_pairs has a negative device id in {pair}")


@rule("send", "recv")
def _send_recv(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    out = _tuple(ins.shape, f"the result of {ins.opcode}", 3)
    if ins.opcode == "send" and not compatible(out.elements[0], ops[0]):
        raise RuleError(f"send's result {out} should start with the data shape {ops[0]}")


@rule("recv-done")
def _recv_done(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    started = _tuple(ops[0], "the operand of recv-done (a recv)", 2)
    _same(
        ins, TupleShape((started.elements[0], make_shape(element_type("token"), ()))), "recv-done gives (data, token)"
    )


@rule("send-done", "outfeed")
def _token_result(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _same(ins, make_shape(element_type("token"), ()), lambda: f"{ins.opcode} gives a token")


@rule("infeed")
def _infeed(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    out = _tuple(ins.shape, "the result of infeed", 2)
    if not (isinstance(out.elements[-1], Shape) and out.elements[-1].element_type.name == "token"):
        raise RuleError(f"infeed's result {out} should end with a token")


@rule("rng-get-and-update-state")
def _rng_state(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    # XLA's RngGetAndUpdateState returns the 128-bit generator state as u64[2].
    _exact(ins, make_shape(element_type("u64"), (2,)), lambda: "the generator state is u64[2]")


@rule("ragged-all-to-all")
def _ragged_all_to_all(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    # (input, output, input_offsets, send_sizes, output_offsets, recv_sizes): the result is the output
    # buffer, updated in place.
    _exact(ins, ops[1], lambda: "ragged-all-to-all returns its output operand updated")
