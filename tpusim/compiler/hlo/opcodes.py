"""The table of HLO opcodes: operand counts and attributes of every opcode in XLA's ``HloOpcode`` list.

The list and the arities are those of xla/hlo/ir/hlo_opcode.h (``HLO_OPCODE_LIST``); the attributes each
opcode accepts, and which ones it requires, are those of ``HloParserImpl::CreateInstruction`` in
xla/hlo/parser/hlo_parser.cc. Opcode groups are plain sets, as the shape rules and later passes use them.
The shape rule of each opcode lives in :mod:`tpusim.compiler.hlo.shape_rules` (``SHAPE_RULES``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ASYNC_COLLECTIVE_DONES",
    "ASYNC_COLLECTIVE_STARTS",
    "ASYNC_SUFFIXES",
    "BINARY_ELEMENTWISE",
    "COLLECTIVES",
    "COMMON_ATTRIBUTES",
    "ELEMENTWISE",
    "OPCODES",
    "OPCODE_ALIASES",
    "TRANSCENDENTAL",
    "UNARY_ELEMENTWISE",
    "OpcodeInfo",
    "lookup_async",
]

COMMON_ATTRIBUTES = frozenset(
    {
        "metadata",
        "sharding",
        "frontend_attributes",
        "statistics",
        "control-predecessors",
        "origin",
        "backend_config",
        "parameter_replication",
    }
)
"""Attributes every instruction may carry (XLA's ParseInstructionRhs adds them to every opcode)."""

ASYNC_SUFFIXES = {"-start": "async-start", "-update": "async-update", "-done": "async-done"}
"""XLA prints an async op wrapping opcode X as ``X-start``/``X-update``/``X-done`` (syntax sugar)."""


@dataclass(frozen=True, slots=True)
class OpcodeInfo:
    """What XLA accepts for one opcode.

    Attributes:
        name: XLA's spelling.
        min_operands: fewest operands.
        max_operands: most operands, None for variadic.
        required: attribute keys that must be present.
        optional: other attribute keys allowed (besides :data:`COMMON_ATTRIBUTES`).
        kinds: per-opcode attribute kinds that differ from the global table, as (key, kind) pairs.
    """

    name: str
    min_operands: int
    max_operands: int | None
    required: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    kinds: tuple[tuple[str, str], ...] = ()

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.required | self.optional))

    def arity_text(self) -> str:
        if self.max_operands == self.min_operands:
            n = self.min_operands
            return f"{n} operand" + ("" if n == 1 else "s")
        if self.max_operands is None:
            return f"at least {self.min_operands} operand" + ("" if self.min_operands == 1 else "s")
        return f"{self.min_operands} to {self.max_operands} operands"


OPCODES: dict[str, OpcodeInfo] = {}


def _op(
    names: str,
    operands: int | tuple[int, int | None],
    required: str = "",
    optional: str = "",
    kinds: tuple[tuple[str, str], ...] = (),
) -> None:
    lo, hi = (operands, operands) if isinstance(operands, int) else operands
    for name in names.split():
        OPCODES[name] = OpcodeInfo(name, lo, hi, frozenset(required.split()), frozenset(optional.split()), kinds)


VARIADIC = (0, None)


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


TRANSCENDENTAL = _names(
    "acos acosh asin asinh atan atanh cbrt cosine cosh erf exponential exponential-minus-one log log-plus-one "
    "logistic rsqrt sine sinh sqrt tan tanh"
)
UNARY_ELEMENTWISE = TRANSCENDENTAL | _names(
    "abs ceil count-leading-zeros floor imag is-finite negate not popcnt real round-nearest-afz round-nearest-even sign"
)
BINARY_ELEMENTWISE = _names(
    "add atan2 complex divide maximum minimum mulhi multiply power remainder subtract and or xor shift-left "
    "shift-right-arithmetic shift-right-logical"
)
ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | _names("clamp compare convert copy select")
"""Ops whose result element at an index is computed from the operands' elements at that index alone (the
groups the passes, layout choice, precision normalisation and buffer assignment reason with)."""

COLLECTIVES = _names("all-reduce all-gather reduce-scatter all-to-all collective-permute collective-broadcast")
"""Collectives that move array data between devices."""
ASYNC_COLLECTIVE_STARTS = _names("all-reduce-start all-gather-start collective-permute-start")
ASYNC_COLLECTIVE_DONES = _names("all-reduce-done all-gather-done collective-permute-done")
"""The collectives with their own async opcode pair (the others run async wrapped in ``async-start``)."""

# ---- elementwise ------------------------------------------------------------------------------
_op(" ".join(sorted(TRANSCENDENTAL)), 1, optional="result_accuracy")
_op(" ".join(sorted(UNARY_ELEMENTWISE - TRANSCENDENTAL)), 1)
_op(" ".join(sorted(BINARY_ELEMENTWISE)), 2)
_op("clamp select", 3)
_op("compare", 2, "direction", "type")
_op("convert bitcast-convert bitcast copy copy-done opt-barrier", 1)
_op("reduce-precision", 1, "exponent_bits mantissa_bits")
_op("stochastic-convert", 2)

# ---- leaves -----------------------------------------------------------------------------------
_op("parameter", 0, "parameter_number")
_op("constant", 0, "literal")
_op("iota", 0, "iota_dimension")
_op("replica-id partition-id", 0)
_op("rng-get-and-update-state", 0, "delta")
_op("after-all", VARIADIC)
_op("add-dependency", 2)

# ---- shape manipulation -----------------------------------------------------------------------
_op("broadcast", 1, optional="dimensions")
_op("reshape", 1, optional="inferred_dimension")
_op("dynamic-reshape", (1, None))
_op("transpose reverse", 1, "dimensions")
_op("slice", 1, "slice")
_op("dynamic-slice", (1, None), "dynamic_slice_sizes")
_op("dynamic-update-slice", (2, None))
_op("concatenate", (1, None), "dimensions")
_op("pad", 2, "padding")
_op("get-dimension-size", 1, "dimensions")
_op("set-dimension-size", 2, "dimensions")
_op("tuple", VARIADIC)
_op("get-tuple-element", 1, "index")
_op("domain", 1, "domain")

# ---- reductions, windows, data movement -------------------------------------------------------
_op("reduce", (2, None), "to_apply dimensions")
_op("reduce-window", (2, None), "to_apply", "window")
_op("select-and-scatter", 3, "select scatter", "window")
_op("map", (1, None), "to_apply", "dimensions")
_op("scan", (1, None), "to_apply dimensions num_carries", "is_reverse is_associative")
_op("sort", (1, None), "dimensions to_apply", "is_stable")
_op("topk", 1, "k", "largest")
_op(
    "gather",
    2,
    "offset_dims collapsed_slice_dims start_index_map index_vector_dim slice_sizes",
    "indices_are_sorted operand_batching_dims start_indices_batching_dims",
)
_op(
    "scatter",
    (3, None),
    "update_window_dims inserted_window_dims scatter_dims_to_operand_dims index_vector_dim to_apply",
    "indices_are_sorted unique_indices input_batching_dims scatter_indices_batching_dims",
)

# ---- linear algebra and numerics ----------------------------------------------------------------
_DOT_DIMS = "lhs_batch_dims rhs_batch_dims lhs_contracting_dims rhs_contracting_dims precision_config"
_op("dot", 2, optional=_DOT_DIMS + " algorithm")
_op("ragged-dot", 3, optional=_DOT_DIMS + " lhs_ragged_dims rhs_group_dims")
_op("scaled-dot", 4, optional=_DOT_DIMS + " algorithm")
_op("convolution", 2, "dim_labels", "window feature_group_count batch_group_count conv_kind precision_config")
_op("fft", 1, "fft_type fft_length")
_op("triangular-solve", 2, optional="left_side lower unit_diagonal transpose_a")
_op("cholesky", 1, optional="lower")
_op("batch-norm-training", 3, "epsilon feature_index")
_op("batch-norm-inference batch-norm-grad", 5, "epsilon feature_index")
_op("rng", VARIADIC, "distribution")
_op("rng-bit-generator", 1, "algorithm")

# ---- calls and control flow ---------------------------------------------------------------------
_op("call", VARIADIC, "to_apply", "is_composite")
_op("fusion", VARIADIC, "calls kind", "output_to_operand_aliasing")
_op("while", 1, "condition body")
_op("conditional", (2, None), optional="true_computation false_computation branch_computations")
_op(
    "custom-call",
    VARIADIC,
    "custom_call_target",
    "window dim_labels feature_group_count batch_group_count operand_layout_constraints "
    "custom_call_has_side_effect to_apply called_computations output_to_operand_aliasing padding_type literal "
    "precision_config schedule api_version",
)
_op("async-start", VARIADIC, optional="calls async_execution_thread output_to_operand_aliasing")
_op("async-update async-done", 1, optional="calls async_execution_thread")

# ---- collectives, channels, host transfers ----------------------------------------------------------
_COLLECTIVE = "replica_groups channel_id constrain_layout use_global_device_ids"
_op("all-reduce all-reduce-start", VARIADIC, "to_apply", _COLLECTIVE + " mode barrier")
_op("reduce-scatter", VARIADIC, "to_apply dimensions", _COLLECTIVE + " mode")
_op("all-gather all-gather-start", VARIADIC, "dimensions", _COLLECTIVE)
_op("all-gather-done all-reduce-done collective-permute-done", 1)
_op("all-to-all", VARIADIC, optional="replica_groups channel_id dimensions constrain_layout")
_op("ragged-all-to-all", 6, optional="replica_groups channel_id dimensions")
_op("collective-broadcast", VARIADIC, optional="replica_groups channel_id")
_op("collective-reduce", VARIADIC, optional="to_apply replica_groups channel_id")
_op(
    "collective-permute collective-permute-start",
    VARIADIC,
    "source_target_pairs",
    "channel_id slice_sizes",
    kinds=(("slice_sizes", "intss"),),
)
_op("copy-start", 1, optional="cross_program_prefetch_index")
_op("send", 2, optional="channel_id is_host_transfer")
_op("recv send-done recv-done", 1, optional="channel_id is_host_transfer")
_op("infeed", 1, optional="infeed_config")
_op("outfeed", 2, optional="outfeed_config outfeed_shape")
_op("shuffle", 1)


OPCODE_ALIASES = {"cross-replica-sum": "all-reduce"}
"""Old spellings XLA printed (cross-replica-sum was renamed all-reduce in 2018) -> today's opcode."""


def lookup_async(opcode: str) -> tuple[str, str] | None:
    """For XLA's async syntax sugar (``custom-call-start``): (async opcode, wrapped opcode), else None."""
    for suffix, async_opcode in ASYNC_SUFFIXES.items():
        if opcode.endswith(suffix) and opcode[: -len(suffix)] in OPCODES:
            return async_opcode, opcode[: -len(suffix)]
    return None


MULTI_DEVICE = frozenset(
    {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast"}
    | {"ragged-all-to-all", "send", "recv", "replica-id", "partition-id"}
)
"""Opcodes (async forms ``X-start`` / ``X-done`` included) that make a program one of several devices."""


def talks_to_other_devices(module: object) -> bool:
    """True for a program of several devices: collectives, sends and receives, device ids."""
    for comp in module.computations:  # type: ignore[attr-defined]
        for instr in comp.instructions:
            base = instr.opcode.removesuffix("-start").removesuffix("-done")
            wrapped = instr.attributes.get("async_wrapped_opcode")  # (XLA's short form of an async-start)
            if instr.opcode in MULTI_DEVICE or base in MULTI_DEVICE or wrapped in MULTI_DEVICE:
                return True
    return False
