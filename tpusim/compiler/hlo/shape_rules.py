"""Shape rules: for each opcode, what its result shape must be given its operands and attributes.

One function per opcode (or group), registered in :data:`SHAPE_RULES` by :func:`rule`. A rule raises
:class:`RuleError` with a sentence naming the rule and the shapes involved; the verifier adds the
computation, the instruction and the source location. The rules follow XLA's shape inference
(xla/service/shape_inference.cc) and XLA's operation semantics (https://openxla.org/xla/operation_semantics).
Element types are checked where XLA fixes them (compare gives pred, elementwise ops keep their operand type);
dot and convolution may change the element type (``preferred_element_type``), so only their dimensions are
checked.
Layouts never matter here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

from tpusim.compiler.hlo.ir import Instruction, Module, ReplicaGroups, WindowDim
from tpusim.compiler.hlo.opcodes import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE
from tpusim.memory import AnyShape, ElementType, Shape, TupleShape, element_type

__all__ = ["SHAPE_RULES", "RuleError", "compatible", "make_shape", "rule"]

Rule = Callable[[Instruction, Sequence[AnyShape], Module], None]
SHAPE_RULES: dict[str, Rule] = {}


class RuleError(Exception):
    """A broken shape rule (turned into an HloVerifyError by the verifier)."""


def rule(*opcodes: str) -> Callable[[Rule], Rule]:
    """Decorator registering the shape rule of one or more opcodes."""

    def deco(fn: Rule) -> Rule:
        for opcode in opcodes:
            SHAPE_RULES[opcode] = fn
        return fn

    return deco


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def compatible(a: AnyShape, b: AnyShape, ignore_fp_precision: bool = False) -> bool:
    """Same element types and dimensions, layouts ignored (XLA's ShapeUtil::Compatible); with
    ``ignore_fp_precision`` any two floating-point types match (ShapeUtil::CompatibleIgnoringFpPrecision)."""
    if isinstance(a, TupleShape) or isinstance(b, TupleShape):
        return (
            isinstance(a, TupleShape)
            and isinstance(b, TupleShape)
            and len(a.elements) == len(b.elements)
            and all(compatible(x, y, ignore_fp_precision) for x, y in zip(a.elements, b.elements))
        )
    if a.dimensions != b.dimensions:
        return False
    return a.element_type == b.element_type or (
        ignore_fp_precision and a.element_type.is_float and b.element_type.is_float
    )


def _loose(a: AnyShape, b: AnyShape) -> bool:
    # NOTE: XLA's backends verify with allow_mixed_precision (floating-point types may differ between the
    # operands, results and called computations of an instruction); so do the rules, to accept every
    # module XLA accepts. Integer, pred and complex types must still match exactly.
    return compatible(a, b, ignore_fp_precision=True)


def _same_element_type(a: Shape, b: Shape) -> bool:
    """XLA's SameElementType under allow_mixed_precision: equal, or both floating-point (complex excluded)."""
    return a.element_type == b.element_type or (a.element_type.is_float and b.element_type.is_float)


def _array(shape: AnyShape, what: str) -> Shape:
    if not isinstance(shape, Shape):
        raise RuleError(f"{what} must be an array, not the tuple {shape}")
    return shape


def _tuple(shape: AnyShape, what: str, at_least: int = 0) -> TupleShape:
    if not isinstance(shape, TupleShape) or len(shape.elements) < at_least:
        raise RuleError(f"{what} must be a tuple of at least {at_least} elements, not {shape}")
    return shape


def _dims(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


Because = str | Callable[[], str]
"""Why a result shape is expected; a callable builds the text only when the rule fails (formatting shapes
for every instruction would dominate the verifier's time)."""


def _why(because: Because) -> str:
    return because if isinstance(because, str) else because()


def _result_dims(ins: Instruction, dims: Sequence[int], because: Because) -> None:
    result = _array(ins.shape, "the result")
    if result.dimensions != tuple(dims):
        raise RuleError(f"result {result} should have dimensions {_dims(dims)} ({_why(because)})")


def _same(ins: Instruction, expected: AnyShape, because: Because) -> None:
    if not _loose(ins.shape, expected):
        raise RuleError(f"result {ins.shape} should be {expected} ({_why(because)})")


def _exact(ins: Instruction, expected: AnyShape, because: Because) -> None:
    """The result is ``expected`` with the same element types: the opcodes XLA's ShapeVerifier::CheckShape
    compares with ShapesSame also under allow_mixed_precision (tuple, get-tuple-element, call, while,
    conditional, dynamic-update-slice ...): they pass values on or update them in place, so a different
    floating-point type there is a wrong program, not a conversion."""
    if not compatible(ins.shape, expected):
        note = "; XLA allows no change of floating-point precision here" if _loose(ins.shape, expected) else ""
        raise RuleError(f"result {ins.shape} should be {expected} ({_why(because)}){note}")


def _dim_list(values: Sequence[int], rank: int, what: str, unique: bool = True, of: object = None) -> None:
    operand = f" {of}" if of is not None else ""
    for d in values:
        if not 0 <= d < rank:
            raise RuleError(
                f"{what} {list(values)} has {d}, which is not a dimension of the rank-{rank} operand{operand}"
            )
    if unique and len(set(values)) != len(values):
        raise RuleError(f"{what} {list(values)} repeats a dimension")


def _scalar(shape: AnyShape, what: str) -> Shape:
    s = _array(shape, what)
    if s.rank:
        raise RuleError(f"{what} must be a scalar, not {s}")
    return s


def _signature(
    module: Module,
    name: str,
    params: Sequence[AnyShape] | int,
    result: AnyShape | str | None,
    role: str,
    exact: bool = False,
) -> None:
    """Check that computation ``name`` takes ``params`` (shapes or a count) and returns ``result``
    (a shape, 'scalars' for scalar or tuple-of-scalar results, or None for any). ``exact``: the same
    floating-point types too (XLA's CheckOperandAndParameter and the ShapesSame results of call, while
    and conditional); otherwise they may differ, as for a reduction's computation."""
    match = compatible if exact else _loose
    if name not in module:
        raise RuleError(f"{role} computation {name} does not exist")
    comp = module[name]
    got = [p.shape for p in comp.parameters]
    if isinstance(params, int):
        if len(got) != params:
            raise RuleError(f"{role} computation {name} should take {params} parameters, it takes {len(got)}")
    else:
        if len(got) != len(params):
            raise RuleError(f"{role} computation {name} should take {len(params)} parameters, it takes {len(got)}")
        for i, (g, want) in enumerate(zip(got, params)):
            if not match(g, want):
                raise RuleError(f"parameter {i} of {role} computation {name} is {g}, expected {want}")
    root = comp.root_instruction.shape if comp.root in comp else None
    if root is None or result is None:
        return
    if result == "scalars":
        leaves = root.leaves() if isinstance(root, TupleShape) else [root]
        if any(leaf.rank for leaf in leaves):
            raise RuleError(f"{role} computation {name} should return scalars, it returns {root}")
    elif not isinstance(result, str) and not match(root, result):
        raise RuleError(f"{role} computation {name} returns {root}, expected {result}")


def make_shape(etype: ElementType, dims: Sequence[int]) -> Shape:
    """A shape for comparisons: unbounded dimensions (-1) are marked dynamic so the Shape is valid."""
    dims = tuple(dims)
    return Shape(etype, dims, tuple(d < 0 for d in dims))


def _scalar_of(shape: Shape) -> Shape:
    return make_shape(shape.element_type, ())


def _window_out(size: int, dim: WindowDim) -> int:
    # XLA's InferWindowOutputShape: sizes, strides and dilations are positive (a stride of 0 divided by zero
    # here); an empty dimension dilates to 0, and its padding still counts
    for what, value in (
        ("size", dim.size),
        ("stride", dim.stride),
        ("base dilation", dim.lhs_dilate),
        ("window dilation", dim.rhs_dilate),
    ):
        if value <= 0:
            raise RuleError(f"a window {what} must be positive, not {value}")
    dilated = (size - 1) * dim.lhs_dilate + 1 if size else 0
    padded = dilated + dim.pad_low + dim.pad_high
    window = (dim.size - 1) * dim.rhs_dilate + 1
    return 0 if padded < window else (padded - window) // dim.stride + 1


def _group_size(ins: Instruction) -> int | None:
    groups = ins.attr("replica_groups")
    if isinstance(groups, ReplicaGroups) and groups.groups:
        sizes = {len(g) for g in groups.groups}
        if len(sizes) != 1:
            raise RuleError(f"replica groups have different sizes {sorted(sizes)}")
        return sizes.pop()
    return None


# ---------------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------------
_COMPONENT = {"c64": "f32", "c128": "f64"}
_COMPLEX = {"f32": "c64", "f64": "c128"}


_FLOATING = ("float", "complex")
_INTEGER = ("signed", "unsigned")
# The element types each elementwise opcode takes, by kind, after XLA's shape inference and StableHLO's
# constraints; exactly the ones the reference interpreter evaluates (opcodes not listed take every kind). A
# module outside them is refused here, located, not in the middle of a run (e.g. `or` of bf16 compiled, and
# its numeric run failed inside numpy).
_OPERAND_KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    opcode: (kinds, what)
    for opcodes, kinds, what in (
        (
            "acos acosh asin asinh atan atanh cosh cosine exponential exponential-minus-one imag log log-plus-one "
            "logistic real rsqrt sine sinh sqrt tan tanh",
            _FLOATING,
            "floating-point or complex",
        ),
        ("atan2 cbrt ceil erf floor is-finite round-nearest-afz round-nearest-even", ("float",), "floating-point"),
        ("count-leading-zeros mulhi popcnt shift-left shift-right-arithmetic shift-right-logical", _INTEGER, "integer"),
        ("and or xor not", ("pred", *_INTEGER), "pred or integer"),
        ("divide negate power sign", (*_FLOATING, *_INTEGER), "numeric (not pred)"),
        ("remainder", ("float", *_INTEGER), "floating-point or integer"),
        ("maximum minimum", ("pred", "float", *_INTEGER), "real (not complex)"),
    )
    for opcode in opcodes.split()
}


def _operand_kind(ins: Instruction, x: Shape) -> None:
    allowed = _OPERAND_KINDS.get(ins.opcode)
    if allowed is not None and x.element_type.kind not in allowed[0]:
        raise RuleError(f"{ins.opcode} takes {allowed[1]} operands, not {x}")


@rule(*UNARY_ELEMENTWISE)
def _unary(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    _operand_kind(ins, x)
    etype = x.element_type.name
    if ins.opcode == "is-finite":
        etype = "pred"
    elif ins.opcode in ("real", "imag", "abs") and etype in _COMPONENT:
        etype = _COMPONENT[etype]
    _same(ins, make_shape(element_type(etype), x.dimensions), lambda: f"{ins.opcode} of {x}")


@rule(*(BINARY_ELEMENTWISE - {"complex"}))
def _binary(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    a, b = _array(ops[0], "the lhs"), _array(ops[1], "the rhs")
    if not _loose(a, b):
        raise RuleError(f"{ins.opcode} needs operands of one shape, found {a} and {b}")
    _operand_kind(ins, a)
    _same(ins, a, lambda: f"{ins.opcode} of {a} and {b}")


@rule("complex")
def _complex(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    a, b = _array(ops[0], "the real part"), _array(ops[1], "the imaginary part")
    if not compatible(a, b) or a.element_type.name not in _COMPLEX:
        raise RuleError(f"complex needs two f32 or f64 operands of one shape, found {a} and {b}")
    _same(ins, make_shape(element_type(_COMPLEX[a.element_type.name]), a.dimensions), lambda: f"complex of {a} and {b}")


@rule("stochastic-convert")
def _stochastic_convert(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    a, bits = _array(ops[0], "the operand"), _array(ops[1], "the random bits")
    if a.dimensions != bits.dimensions:
        raise RuleError(f"operand {a} and random bits {bits} must have the same dimensions")
    _result_dims(ins, a.dimensions, lambda: f"stochastic-convert of {a}")


_DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")
# The comparison types each kind of element type takes (StableHLO's compare, constraint C3; XLA's parser
# knows no others).
_COMPARE_TYPES = {
    "float": ("FLOAT", "TOTALORDER", "PARTIALORDER"),
    "complex": ("FLOAT",),
    "signed": ("SIGNED",),
    "unsigned": ("UNSIGNED",),
    "pred": ("UNSIGNED",),
}


@rule("compare")
def _compare(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    a, b = _array(ops[0], "the lhs"), _array(ops[1], "the rhs")
    if not _loose(a, b):
        raise RuleError(f"compare needs operands of one shape, found {a} and {b}")
    direction = ins.attr("direction")
    if direction not in _DIRECTIONS:
        raise RuleError(f"direction={direction} is not a comparison direction ({', '.join(_DIRECTIONS)})")
    # complex values have no order: XLA's emitters and evaluator, and the reference, compare them for equality
    if a.element_type.is_complex and direction not in ("EQ", "NE"):
        raise RuleError(f"complex operands only compare EQ or NE, not {direction}")
    ctype = ins.attr("type")
    allowed = _COMPARE_TYPES.get(a.element_type.kind, ())
    if ctype is not None and ctype not in allowed:
        known = sorted({t for ts in _COMPARE_TYPES.values() for t in ts})
        if ctype not in known:
            raise RuleError(f"type={ctype} is not a comparison type ({', '.join(known)})")
        raise RuleError(f"type={ctype} does not compare {a.element_type.name} values (use {' or '.join(allowed)})")
    _same(ins, make_shape(element_type("pred"), a.dimensions), lambda: f"compare of {a} and {b} gives pred")


@rule("select")
def _select(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    pred, on_true, on_false = ops
    p = _array(pred, "the predicate")
    if p.element_type.name != "pred":
        raise RuleError(f"the predicate of select must be pred, not {p}")
    if not _loose(on_true, on_false):
        raise RuleError(f"select needs both branches of one shape, found {on_true} and {on_false}")
    if isinstance(on_true, Shape) and p.rank and p.dimensions != on_true.dimensions:
        raise RuleError(f"predicate {p} and branches {on_true} have different dimensions")
    _same(ins, on_true, lambda: f"select of {on_true}")


@rule("clamp")
def _clamp(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    low, x, high = (_array(s, w) for s, w in zip(ops, ("min", "operand", "max")))
    for bound, what in ((low, "min"), (high, "max")):
        same_type = bound.element_type == x.element_type or (bound.element_type.is_float and x.element_type.is_float)
        if not same_type or (bound.rank and bound.dimensions != x.dimensions):
            raise RuleError(f"clamp's {what} {bound} must be a scalar or match the operand {x}")
    _same(ins, x, lambda: f"clamp of {x}")


@rule(
    "convert",
    "reduce-precision",
    "copy",
    "domain",
    "collective-broadcast",
    "collective-permute-done",
    "all-reduce-done",
    "async-update",
    "opt-barrier",
    "cholesky",
)
def _same_dims_or_shape(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = ops[0]
    if ins.opcode == "convert":
        _result_dims(ins, _array(x, "the operand").dimensions, lambda: f"convert of {x}")
        return
    if ins.opcode == "collective-permute-done" and isinstance(x, TupleShape) and len(x.elements) >= 2:
        x = x.elements[1]
    if ins.opcode == "cholesky":
        a = _array(x, "the operand")
        if a.rank < 2 or a.dimensions[-1] != a.dimensions[-2]:
            raise RuleError(f"cholesky needs square matrices in the last two dimensions, found {a}")
    _same(ins, x, lambda: f"{ins.opcode} keeps its operand's shape")


@rule("bitcast-convert")
def _bitcast_convert(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x, out = _array(ops[0], "the operand"), _array(ins.shape, "the result")
    a, b = x.element_type.bits, out.element_type.bits
    if a == b:
        expected = x.dimensions
    elif a > b:
        expected = (*x.dimensions, a // b)
    else:
        if not x.rank or x.dimensions[-1] != b // a:
            raise RuleError(f"bitcast-convert from {x} to {out.element_type.name} needs a last dimension of {b // a}")
        expected = x.dimensions[:-1]
    _result_dims(ins, expected, lambda: f"bitcast-convert of {x} to {out.element_type.name}")


@rule("bitcast")
def _bitcast(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    """The same bits (a module whose layouts are still open), or, as XLA's layout-sensitive verifier, the
    same physical bytes under the layouts the text writes: XLA:TPU bitcasts ``f32[501]{0:T(512)}`` to
    ``f32[512]{0:T(512)}``, the operand's padding becoming elements (reference: the bytes reinterpreted)."""
    x, out = _array(ops[0], "the operand"), _array(ins.shape, "the result")
    bits, out_bits = prod(x.dimensions) * x.element_type.bits, prod(out.dimensions) * out.element_type.bits
    if bits != out_bits and x.byte_size != out.byte_size:
        raise RuleError(
            f"bitcast from {x} to {out} changes the number of bits ({bits} to {out_bits}) and of bytes under "
            f"their layouts ({x.byte_size} to {out.byte_size})"
        )


# ---------------------------------------------------------------------------------------------
# leaves and structure
# ---------------------------------------------------------------------------------------------
@rule("iota")
def _iota(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    out = _array(ins.shape, "the result")
    d = ins.attr("iota_dimension")
    if not isinstance(d, int) or not 0 <= d < out.rank:
        raise RuleError(f"iota_dimension={d} is not a dimension of {out}")


@rule("constant")
def _constant(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    literal = ins.attr("literal")
    if literal is None or not compatible(literal.shape, ins.shape):
        raise RuleError(f"the constant's value does not have its shape {ins.shape}")


@rule("replica-id", "partition-id")
def _device_id(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _same(ins, make_shape(element_type("u32"), ()), lambda: f"{ins.opcode} is a u32 scalar")


@rule("after-all")
def _after_all(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    for i, s in enumerate(ops):
        if not (isinstance(s, Shape) and s.element_type.name == "token"):
            raise RuleError(f"operand {i} of after-all must be a token, not {s}")
    _same(ins, make_shape(element_type("token"), ()), "after-all gives a token")


@rule("add-dependency")
def _add_dependency(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _same(ins, ops[0], "add-dependency passes its first operand through")


@rule("tuple")
def _tuple_rule(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    _exact(ins, TupleShape(tuple(ops)), "a tuple holds its operands")


@rule("get-tuple-element")
def _gte(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    t = _tuple(ops[0], "the operand of get-tuple-element")
    i = ins.attr("index")
    if not isinstance(i, int) or not 0 <= i < len(t.elements):
        raise RuleError(f"index={i} is out of range for the {len(t.elements)}-element tuple {t}")
    _exact(ins, t.elements[i], lambda: f"element {i} of {t}")


# ---------------------------------------------------------------------------------------------
# shape manipulation
# ---------------------------------------------------------------------------------------------
@rule("broadcast")
def _broadcast(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x, out = _array(ops[0], "the operand"), _array(ins.shape, "the result")
    dims = ins.attr("dimensions", () if x.rank == 0 else None)
    if dims is None:
        raise RuleError(f"broadcast of the non-scalar {x} needs dimensions=")
    if len(dims) != x.rank:
        raise RuleError(f"dimensions={list(dims)} must list one result dimension per operand dimension of {x}")
    _dim_list(dims, out.rank, "dimensions", of=out)
    if list(dims) != sorted(dims):
        raise RuleError(f"broadcast dimensions={list(dims)} must be increasing")
    for i, d in enumerate(dims):
        if out.dimensions[d] != x.dimensions[i]:
            raise RuleError(f"operand dimension {i} of {x} maps to result dimension {d} of {out}: sizes differ")
    if not _same_element_type(out, x):
        raise RuleError(f"broadcast changes the element type from {x} to {out} (only a float's precision may)")


@rule("reshape")
def _reshape(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x, out = _array(ops[0], "the operand"), _array(ins.shape, "the result")
    if not _same_element_type(out, x) or prod(x.dimensions) != prod(out.dimensions):
        raise RuleError(
            f"reshape from {x} to {out} must keep the element count and type (only a float's precision may change)"
        )


@rule("dynamic-reshape")
def _dynamic_reshape(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    out = _array(ins.shape, "the result")
    if out.rank != len(ops) - 1:
        raise RuleError(f"dynamic-reshape to {out} needs {out.rank} size operands, found {len(ops) - 1}")


@rule("transpose")
def _transpose(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    perm = ins.attr("dimensions", ())
    if sorted(perm) != list(range(x.rank)):
        raise RuleError(f"dimensions={list(perm)} is not a permutation of the {x.rank} dimensions of {x}")
    _same(
        ins,
        make_shape(x.element_type, tuple(x.dimensions[p] for p in perm)),
        lambda: f"transpose of {x} by {list(perm)}",
    )


@rule("reverse")
def _reverse(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    _dim_list(ins.attr("dimensions", ()), x.rank, "dimensions", of=x)
    _same(ins, x, lambda: f"reverse keeps the shape of {x}")


@rule("slice")
def _slice(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    ranges = ins.attr("slice", ())
    if len(ranges) != x.rank:
        raise RuleError(f"slice has {len(ranges)} ranges for the rank-{x.rank} operand {x}")
    out = []
    for i, (r, d) in enumerate(zip(ranges, x.dimensions)):
        if not (0 <= r.start <= r.limit <= d and r.stride > 0):
            raise RuleError(
                f"slice range [{r.start}:{r.limit}:{r.stride}] does not fit dimension {i} (size {d}) of {x}"
            )
        out.append(-(-(r.limit - r.start) // r.stride))
    _same(ins, make_shape(x.element_type, tuple(out)), lambda: f"slice of {x}")


def _check_indices(ops: Sequence[AnyShape], first: int, rank: int, opcode: str) -> None:
    indices = ops[first:]
    if len(indices) == 1 and isinstance(indices[0], Shape) and indices[0].rank == 1 and rank != 1:
        return  # the old form: one vector of start indices
    if len(indices) != rank:
        raise RuleError(f"{opcode} of a rank-{rank} operand needs {rank} scalar start indices, found {len(indices)}")
    for i, s in enumerate(indices):
        _scalar(s, f"start index {i}")


@rule("dynamic-slice")
def _dynamic_slice(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    _check_indices(ops, 1, x.rank, "dynamic-slice")
    sizes = ins.attr("dynamic_slice_sizes", ())
    if len(sizes) != x.rank or any(not 0 <= s <= d for s, d in zip(sizes, x.dimensions)):
        raise RuleError(f"dynamic_slice_sizes={list(sizes)} do not fit the operand {x}")
    _same(ins, make_shape(x.element_type, tuple(sizes)), lambda: f"dynamic-slice of {x}")


@rule("dynamic-update-slice")
def _dynamic_update_slice(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x, update = _array(ops[0], "the operand"), _array(ops[1], "the update")
    _check_indices(ops, 2, x.rank, "dynamic-update-slice")
    if update.rank != x.rank or any(u > d for u, d in zip(update.dimensions, x.dimensions)):
        raise RuleError(f"update {update} does not fit inside the operand {x}")
    _exact(ins, x, lambda: f"dynamic-update-slice keeps the shape of {x}")


@rule("concatenate")
def _concatenate(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    arrays = [_array(s, f"operand {i}") for i, s in enumerate(ops)]
    (d,) = ins.attr("dimensions", (None,))[:1] or (None,)
    first = arrays[0]
    if not isinstance(d, int) or not 0 <= d < first.rank:
        raise RuleError(f"dimensions={list(ins.attr('dimensions', ()))} is not one dimension of {first}")
    for a in arrays[1:]:
        if (
            a.rank != first.rank
            or not _same_element_type(a, first)
            or any(x != y for i, (x, y) in enumerate(zip(a.dimensions, first.dimensions)) if i != d)
        ):
            raise RuleError(f"cannot concatenate {first} and {a} along dimension {d}")
    dims = list(first.dimensions)
    dims[d] = sum(a.dimensions[d] for a in arrays)
    _same(ins, make_shape(first.element_type, tuple(dims)), lambda: f"concatenation along dimension {d}")


@rule("pad")
def _pad(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    value = _scalar(ops[1], "the padding value")
    if not _same_element_type(value, x):
        raise RuleError(f"padding value {value} and operand {x} have different element types (other than two floats)")
    config = ins.attr("padding", ())
    if len(config) != x.rank:
        raise RuleError(f"padding has {len(config)} dimensions for the rank-{x.rank} operand {x}")
    dims = []
    for p, d in zip(config, x.dimensions):
        if p.interior < 0:
            raise RuleError(f"interior padding {p.interior} is negative")
        dims.append(p.low + p.high + d + max(d - 1, 0) * p.interior)
    _same(ins, make_shape(x.element_type, tuple(dims)), lambda: f"pad of {x}")


@rule("get-dimension-size")
def _get_dimension_size(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    _dim_list(ins.attr("dimensions", ())[:1], x.rank, "dimensions", of=x)
    _same(ins, make_shape(element_type("s32"), ()), "get-dimension-size gives an s32 scalar")


@rule("set-dimension-size")
def _set_dimension_size(ins: Instruction, ops: Sequence[AnyShape], module: Module) -> None:
    x = _array(ops[0], "the operand")
    _dim_list(ins.attr("dimensions", ())[:1], x.rank, "dimensions", of=x)
    _result_dims(ins, x.dimensions, lambda: f"set-dimension-size keeps the dimensions of {x}")
