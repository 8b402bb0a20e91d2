"""The reference interpreter's core: values, the opcode registry, the evaluation context and ``evaluate``.

A value is what one HLO instruction produces: a numpy array with the exact dtype of the result element
type (0-d for scalars; ``ml_dtypes`` types for bf16, f8, s4 ...), a tuple of values for tuple shapes, or
the singleton :data:`TOKEN`. Every opcode has one function in :data:`REFERENCE`,
``fn(ctx, instr, args) -> Value``, filled by :func:`register` in the sibling modules.

Computations are compiled once into a :class:`_Plan` (instructions in dependency order, operand slots,
the slot each value can be dropped after) and run by :meth:`EvalContext.run`. Each result is checked
against the instruction's declared shape, so a wrong dtype or shape from any op function is reported at
the instruction that produced it, never silently passed on.

Several devices (replicas x partitions) run as threads in lockstep; their collectives meet in a
:class:`tpusim.compiler.hlo.reference.exchange.Exchange` that detects deadlocks (see ``exchange.py``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import numpy as np

from tpusim.compiler.hlo.called_types import CALLING, called_types
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.errors import TpusimError
from tpusim.limits import DEFAULT_MAX_STEPS, LimitHit, RunLimitError, check_limits, note_interrupt
from tpusim.memory import AnyShape, ElementType, Shape, TupleShape
from tpusim.semantics.convert import convert, is_narrow_float

__all__ = [
    "ELEMENTWISE",
    "REFERENCE",
    "TOKEN",
    "DeviceState",
    "EvalContext",
    "EvaluationError",
    "Host",
    "InputError",
    "RefFn",
    "Token",
    "UnsupportedOpcodeError",
    "Value",
    "check_value",
    "evaluate",
    "evaluate_instruction",
    "evaluate_spmd",
    "format_instr",
    "register",
]


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------
class Token:
    """The value of a ``token[]`` shape: carries ordering, no data. Use the singleton :data:`TOKEN`."""

    __slots__ = ()
    _instance: Token | None = None

    def __new__(cls) -> Token:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "TOKEN"


TOKEN: Final = Token()

Value: TypeAlias = "np.ndarray | tuple[Value, ...] | Token"


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
def format_instr(instr: Instruction) -> str:
    """``%name (opcode, line 12 (model.py:40))``: how errors name an instruction."""
    where = f", {instr.loc}" if instr.loc is not None else ""
    return f"%{instr.name} ({instr.opcode}{where})"


class EvaluationError(TpusimError):
    """An instruction the reference interpreter cannot evaluate, or evaluated with bad operands.

    Args:
        instr: the failing instruction (None when the error is not about one instruction).
        message: what is wrong.
    """

    def __init__(self, instr: Instruction | None, message: str) -> None:
        self.instr = instr
        self.message = message
        super().__init__(f"{format_instr(instr)}: {message}" if instr is not None else message)


class UnsupportedOpcodeError(EvaluationError):
    """An opcode (or custom-call target) the reference interpreter has no function for."""


class InputError(TpusimError):
    """Inputs handed to :func:`evaluate` that do not match the entry computation's parameters."""


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------
RefFn = Callable[["EvalContext", Instruction, Sequence[Value]], Value]

REFERENCE: dict[str, RefFn] = {}
"""opcode -> reference function ``fn(ctx, instr, args) -> Value``."""

ELEMENTWISE: set[str] = set()
"""Opcodes whose function works on operands of any (broadcastable) shape and never reads the result
dimensions: :meth:`EvalContext.vectorized_call` runs a scalar computation made only of these on whole
arrays at once."""


def register(*opcodes: str, elementwise: bool = False) -> Callable[[RefFn], RefFn]:
    """Decorator filling :data:`REFERENCE` for ``opcodes``.

    Args:
        opcodes: XLA opcode spellings the function implements.
        elementwise: True when the function is shape-agnostic (see :data:`ELEMENTWISE`).

    Returns:
        The decorator; it returns the function unchanged.
    """

    def deco(fn: RefFn) -> RefFn:
        for op in opcodes:
            if op in REFERENCE and REFERENCE[op] is not fn:
                raise RuntimeError(f"reference for opcode {op!r} registered twice ({REFERENCE[op].__module__})")
            REFERENCE[op] = fn
            if elementwise:
                ELEMENTWISE.add(op)
        return fn

    return deco


# ---------------------------------------------------------------------------------------------
# Value checks
# ---------------------------------------------------------------------------------------------
def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if isinstance(value, Token):
        return "token"
    return type(value).__name__


def check_value(value: Any, shape: AnyShape, *, dims: bool = True) -> str | None:
    """Why ``value`` does not conform to ``shape`` (dtype, dimensions, tuple structure), or None if it does.

    Args:
        value: a candidate :data:`Value`.
        shape: the declared shape.
        dims: False to check element types and tuple structure only (vectorised scalar computations).
    """
    if isinstance(shape, TupleShape):
        if not isinstance(value, tuple) or len(value) != len(shape.elements):
            return f"expected a tuple of {len(shape.elements)} for {shape}, got {_describe(value)}"
        for i, (v, s) in enumerate(zip(value, shape.elements)):
            why = check_value(v, s, dims=dims)
            if why is not None:
                return f"tuple element {i}: {why}"
        return None
    et = shape.element_type
    if et.dtype is None:
        return None if isinstance(value, Token) else f"expected a token, got {_describe(value)}"
    if not isinstance(value, np.ndarray):
        return f"expected an array {shape}, got {_describe(value)}"
    if value.dtype != et.dtype:
        return f"expected element type {et.name} (numpy {et.dtype}), got {value.dtype}"
    if dims and value.shape != shape.dimensions:
        return f"expected dimensions {list(shape.dimensions)}, got {list(value.shape)}"
    return None


# XLA's verifier requires these opcodes' results to have exactly the inferred shape, also with
# allow_mixed_precision (ShapeVerifier::CheckShape): they reinterpret, pass on or update values in place.
SAME_PRECISION_OPCODES: Final = frozenset(
    {
        "bitcast",
        "call",
        "conditional",
        "constant",
        "copy-start",
        "copy-done",
        "custom-call",
        "dynamic-update-slice",
        "get-tuple-element",
        "infeed",
        "outfeed",
        "opt-barrier",
        "parameter",
        "recv",
        "recv-done",
        "send",
        "send-done",
        "tuple",
        "while",
    }
)


def _is_real_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or is_narrow_float(dtype)


def mixed_precision_result(instr: Instruction, args: Sequence[Any], out: Any) -> Value | None:
    """``out`` rounded to ``instr``'s declared floating-point type when ``instr`` is mixed precision, else None.

    XLA verifies HLO with ``allow_mixed_precision`` on the backends whose passes produce it (BFloat16
    Propagation): an instruction may then define its result in another floating-point type than the one
    its operands give (``f16 copy(f32)``, ``bf16 transpose(f32)``, ``f16 select(pred, f32, bf16)``), and
    XLA's FloatNormalization gives it the meaning used here: the operation on the operands' values, then
    one ``convert`` to the declared type. Only when some floating-point operand has another type than the
    declared result (an op that returns a wrong dtype from same-typed operands is still reported) and never
    for :data:`SAME_PRECISION_OPCODES`. Each element of a tuple result is rounded so (XLA:TPU narrows an
    argmin's unused value result to bf16 while its reducer computes in f32).
    """
    shape = instr.shape
    if instr.opcode in SAME_PRECISION_OPCODES:
        return None
    if not isinstance(shape, TupleShape):
        return _rounded(shape, args, out)
    if not isinstance(out, tuple) or len(out) != len(shape.elements):
        return None
    rounded = [_rounded(s, args, o) if isinstance(s, Shape) else None for s, o in zip(shape.elements, out)]
    if all(r is None for r in rounded):
        return None
    return tuple(o if r is None else r for o, r in zip(out, rounded))


def _rounded(shape: Shape, args: Sequence[Any], out: Any) -> np.ndarray | None:
    """``out`` converted to ``shape``'s floating-point type when it has another floating-point type and some
    floating-point operand has a type other than ``shape``'s; else None."""
    if shape.element_type.kind != "float":
        return None
    want = shape.element_type.dtype
    if not isinstance(out, np.ndarray) or out.dtype == want or not _is_real_float(out.dtype):
        return None
    if not any(isinstance(a, np.ndarray) and _is_real_float(a.dtype) and a.dtype != want for a in args):
        return None
    return convert(out, shape.element_type)


def called_arguments(module: Module, instr: Instruction, args: Sequence[Any]) -> list[Any]:
    """``args`` of an instruction that calls a computation on its elements (reduce, sort, scatter ...), each
    float operand converted to the float type of the computation parameter it feeds (mixed precision:
    XLA:TPU's ``(f32, s32) sort(bf16 x, s32 iota)`` has an f32 comparator; :mod:`..called_types`)."""
    types = called_types(module, instr)
    if types is None or len(types[0]) != len(args):
        return list(args)
    return [_in_float(a, t) for a, t in zip(args, types[0])]


def declared_results(instr: Instruction, out: Any) -> Any:
    """``out`` of an instruction that calls a computation on its elements, each float result (tuple elements
    too) converted to its declared float type: the operation computes in its computation's types, and a
    declared type other than that is a convert of the result (mixed precision)."""
    if not isinstance(instr.shape, TupleShape):
        return _in_float(out, instr.shape.element_type)
    if not isinstance(out, tuple) or len(out) != len(instr.shape.elements):
        return out
    types = [s.element_type if isinstance(s, Shape) else None for s in instr.shape.elements]
    return tuple(_in_float(o, t) for o, t in zip(out, types))


def _in_float(value: Any, etype: ElementType | None) -> Any:
    """``value`` converted to the float type ``etype`` when it is an array of another real float type."""
    if etype is None or etype.kind != "float" or not isinstance(value, np.ndarray):
        return value
    if value.dtype == etype.dtype or not _is_real_float(value.dtype):
        return value
    return convert(value, etype)


# ---------------------------------------------------------------------------------------------
# Host queues
# ---------------------------------------------------------------------------------------------
@dataclass
class DeviceState:
    """State one device keeps between evaluations (a simulated chip runs many fallback kernels).

    Attributes:
        rng_state: the 128-bit state of ``rng-get-and-update-state`` and ``rng`` (starts at 0).
    """

    rng_state: int = 0


@dataclass
class Host:
    """Data exchanged with the host by one device: infeed, outfeed and host send/recv channels.

    Attributes:
        infeed: values ``infeed`` instructions take, first to last (each matches the infeed's data shape).
        outfeed: values ``outfeed`` instructions produced, in program order.
        recv: per channel id, values host ``recv`` instructions take, first to last.
        sent: per channel id, values host ``send`` instructions produced, in program order.
    """

    infeed: deque[Value] = field(default_factory=deque)
    outfeed: list[Value] = field(default_factory=list)
    recv: dict[int, deque[Value]] = field(default_factory=dict)
    sent: dict[int, list[Value]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.infeed = deque(_as_value(v) for v in self.infeed)
        self.recv = {int(k): deque(_as_value(x) for x in v) for k, v in self.recv.items()}


def _as_value(value: Any) -> Any:
    """Numpy scalars become 0-d arrays of their exact dtype; tuples are walked; anything else is kept."""
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, tuple):
        return tuple(_as_value(v) for v in value)
    return value


# ---------------------------------------------------------------------------------------------
# Compiled computations
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Step:
    instr: Instruction
    fn: RefFn | None  # None: no reference function (error raised when the step runs)
    operands: tuple[int, ...]
    slot: int
    frees: tuple[int, ...]  # slots whose last use is this step


@dataclass(frozen=True, slots=True)
class _Plan:
    computation: Computation
    param_slots: tuple[int, ...]  # slot of parameter(i), by parameter number
    param_shapes: tuple[AnyShape, ...]
    steps: tuple[_Step, ...]
    root: int
    num_slots: int
    vectorizable: bool  # every instruction elementwise and every shape a scalar or tuple of scalars


def _topological_order(comp: Computation) -> list[Instruction]:
    """Instructions in an order where operands (and control predecessors) come first; text order when valid."""
    position = {ins.name: i for i, ins in enumerate(comp.instructions)}
    in_order = True
    for i, ins in enumerate(comp.instructions):
        for op in _dependencies(ins):
            if op not in position:
                raise EvaluationError(ins, f"operand %{op} is not an instruction of computation {comp.name}")
            if position[op] >= i:
                in_order = False
    if in_order:
        return list(comp.instructions)
    order: list[Instruction] = []
    state: dict[str, int] = {}  # 1 = visiting, 2 = done
    for start in comp.instructions:
        stack: list[tuple[Instruction, int]] = [(start, 0)]
        while stack:
            ins, k = stack.pop()
            if k == 0:
                if state.get(ins.name) == 2:
                    continue
                state[ins.name] = 1
            deps = _dependencies(ins)
            if k < len(deps):
                stack.append((ins, k + 1))
                dep = comp[deps[k]]
                if state.get(dep.name) == 1:
                    raise EvaluationError(ins, f"computation {comp.name} has a cycle through %{dep.name}")
                if state.get(dep.name) != 2:
                    stack.append((dep, 0))
            else:
                state[ins.name] = 2
                order.append(ins)
    return order


def _dependencies(ins: Instruction) -> tuple[str, ...]:
    preds = ins.attr("control-predecessors", ())
    return ins.operands + (tuple(preds) if isinstance(preds, tuple) else ())


def _is_scalar_shape(shape: AnyShape) -> bool:
    if isinstance(shape, TupleShape):
        return all(_is_scalar_shape(e) for e in shape.elements)
    return shape.rank == 0


def _compile(comp: Computation) -> _Plan:
    order = _topological_order(comp)
    slot_of = {ins.name: i for i, ins in enumerate(order)}
    params = comp.parameters
    numbers = [p.attr("parameter_number") for p in params]
    if numbers != list(range(len(params))):
        raise EvaluationError(params[0] if params else None, f"computation {comp.name} has parameter numbers {numbers}")
    last_use: dict[int, int] = {}
    steps_pre: list[tuple[Instruction, tuple[int, ...]]] = []
    for ins in order:
        if ins.opcode == "parameter":
            continue
        ops = tuple(slot_of[o] for o in ins.operands)
        for s in ops:
            last_use[s] = len(steps_pre)
        steps_pre.append((ins, ops))
    root = slot_of[comp.root]
    frees_at: dict[int, list[int]] = {}
    for s, k in last_use.items():
        if s != root:
            frees_at.setdefault(k, []).append(s)
    steps = tuple(
        _Step(ins, REFERENCE.get(ins.opcode), ops, slot_of[ins.name], tuple(frees_at.get(k, ())))
        for k, (ins, ops) in enumerate(steps_pre)
    )
    # NOTE: between scalars a bitcast-convert keeps the width, so it is elementwise there (JAX's total-order
    # sort comparators bitcast f32 keys to s32; called per element, a sort of 4096 of them took 30 s).
    vectorizable = all(
        (ins.opcode in ("parameter", "bitcast-convert") or ins.opcode in ELEMENTWISE) and _is_scalar_shape(ins.shape)
        for ins in comp.instructions
    )
    return _Plan(
        comp,
        tuple(slot_of[p.name] for p in params),
        tuple(p.shape for p in params),
        steps,
        root,
        len(order),
        vectorizable,
    )


class _PlanCache:
    """Compiled computations of one module, shared by every device of a run (read-mostly, lock on fill)."""

    def __init__(self, module: Module | None) -> None:
        self.module = module
        self._plans: dict[str, _Plan] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> _Plan:
        plan = self._plans.get(name)
        if plan is None:
            if self.module is None or name not in self.module:
                raise EvaluationError(None, f"computation {name!r} is not in the module")
            with self._lock:
                plan = self._plans.get(name) or _compile(self.module[name])
                self._plans[name] = plan
        return plan


# ---------------------------------------------------------------------------------------------
# Evaluation context
# ---------------------------------------------------------------------------------------------
class EvalContext:
    """What one device's evaluation gives the op functions.

    Attributes:
        module: the module being run.
        replica_id, partition_id: this device's coordinates.
        num_replicas, num_partitions: the run's device grid (devices = replicas x partitions).
        host: this device's host queues (infeed, outfeed, host send/recv).
        rng_state: the 128-bit state of ``rng-get-and-update-state`` (starts at 0, documented choice).
        computation: the computation currently running (ops read operand shapes through it).
        exchange: the rendezvous shared by the devices of a multi-device run (None on a single device).
    """

    def __init__(
        self,
        module: Module | None,
        *,
        replica_id: int = 0,
        partition_id: int = 0,
        num_replicas: int = 1,
        num_partitions: int = 1,
        host: Host | None = None,
        exchange: Any = None,
        plans: _PlanCache | None = None,
        state: DeviceState | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
    ) -> None:
        self.module = module
        self.replica_id = replica_id
        self.partition_id = partition_id
        self.num_replicas = num_replicas
        self.num_partitions = num_partitions
        self.host = host if host is not None else Host()
        self.exchange = exchange
        self.state = state if state is not None else DeviceState()
        self.computation: Computation | None = None
        self._plans = plans if plans is not None else _PlanCache(module)
        # run limit (tpusim.limits): while iterations of the whole run; the whiles running, innermost last,
        # each [instruction, computation name, iterations of its current execution]
        self.max_steps = max_steps
        self.loop_steps = 0
        self.loops: list[list[Any]] = []
        self.cancelled = False  # set from another thread to stop this device at its next loop iteration

    @property
    def rng_state(self) -> int:
        return self.state.rng_state

    @rng_state.setter
    def rng_state(self, value: int) -> None:
        self.state.rng_state = value

    # ----------------------------------------------------------------- device coordinates
    @property
    def device_id(self) -> int:
        """XLA's flattened (global) device id: ``replica_id * num_partitions + partition_id``."""
        return self.replica_id * self.num_partitions + self.partition_id

    @property
    def num_devices(self) -> int:
        return self.num_replicas * self.num_partitions

    # ----------------------------------------------------------------- running computations
    def run(self, name: str, args: Sequence[Value], *, vectorized: bool = False) -> Value:
        """Evaluate computation ``name`` on ``args`` (one per parameter) and return its root value."""
        plan = self._plans.get(name)
        if len(args) != len(plan.param_slots):
            raise EvaluationError(
                None, f"computation {name} takes {len(plan.param_slots)} arguments, {len(args)} were passed"
            )
        values: list[Any] = [None] * plan.num_slots
        for slot, arg in zip(plan.param_slots, args):
            values[slot] = arg
        saved, self.computation = self.computation, plan.computation
        try:
            for step in plan.steps:
                values[step.slot] = self._execute(step, [values[i] for i in step.operands], vectorized)
                for s in step.frees:
                    values[s] = None
        finally:
            self.computation = saved
        return values[plan.root]

    def _execute(self, step: _Step, args: list[Any], vectorized: bool) -> Value:
        instr = step.instr
        if step.fn is None:
            raise _unsupported(instr)
        calling = instr.opcode in CALLING and self.module is not None
        try:
            if calling:
                assert self.module is not None
                args = called_arguments(self.module, instr, args)
            out = step.fn(self, instr, args)
            if calling:
                out = declared_results(instr, out)
        except TpusimError:
            raise
        except Exception as exc:  # a bug or an unforeseen operand: name the instruction, keep the cause
            raise EvaluationError(instr, f"reference failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(out, np.generic):  # numpy's ufuncs give a scalar for 0-d operands: the value, as an array
            out = np.asarray(out)
        why = check_value(out, instr.shape, dims=not vectorized)
        if why is not None:
            rounded = mixed_precision_result(instr, args, out)
            if rounded is not None:
                out, why = rounded, check_value(rounded, instr.shape, dims=not vectorized)
        if why is not None:
            raise EvaluationError(instr, f"reference of {instr.opcode!r} returned a wrong value: {why}")
        return out

    def call(self, name: str, args: Sequence[Value]) -> Value:
        """Run a called computation (``to_apply``, ``body`` ...) on ``args`` and return its result."""
        return self.run(name, args)

    # ----------------------------------------------------------------- loops and the run limit
    def iterate(self, frame: list[Any]) -> None:
        """Count one more iteration of the ``while`` of ``frame`` (see :meth:`enter_loop`); raises
        RunLimitError past ``max_steps`` iterations of the run."""
        if self.cancelled:
            raise KeyboardInterrupt
        if self.loop_steps >= self.max_steps:
            raise self._limit_error()
        self.loop_steps += 1
        frame[2] += 1

    def enter_loop(self, instr: Instruction) -> list[Any]:
        """Start a ``while``: a frame :meth:`iterate` counts in; give it back to :meth:`leave_loop`."""
        frame = [instr, self.computation.name if self.computation is not None else None, 0]
        self.loops.append(frame)
        return frame

    def leave_loop(self, frame: list[Any]) -> None:
        if self.loops and self.loops[-1] is frame:
            self.loops.pop()

    def _current_loop(self) -> list[Any] | None:
        """The running while with the most iterations in its current execution (the innermost on a tie)."""
        best = None
        for frame in self.loops:
            if best is None or frame[2] >= best[2]:
                best = frame
        return best

    def _limit_error(self) -> RunLimitError:
        frame = self._current_loop()
        device = f", device {self.device_id}" if self.num_devices > 1 else ""
        where = f"after {self.loop_steps:,} while iterations in all (the reference interpreter{device})"
        if frame is None:
            return RunLimitError.of(LimitHit("max_steps", self.max_steps, None, 0, where))
        instr, comp, n = frame
        line = str(instr.loc) if instr.loc is not None else None
        return RunLimitError.of(
            LimitHit("max_steps", self.max_steps, instr.name, n, where, opcode="while", computation=comp, line=line)
        )

    def position(self) -> str:
        """Where the evaluation stands, for Ctrl-C: the while running and its iteration, or the computation."""
        device = f", device {self.device_id}" if self.num_devices > 1 else ""
        frame = self._current_loop()
        if frame is not None:
            instr, comp, n = frame
            return (
                f"in the reference interpreter{device}: while %{instr.name} (computation {comp}) on iteration "
                f"{max(n, 1):,}, {self.loop_steps:,} while iterations in all"
            )
        comp = self.computation.name if self.computation is not None else None
        return f"in the reference interpreter{device}" + (f", computation {comp}" if comp else "")

    def vectorized_call(self, name: str, arrays: Sequence[np.ndarray]) -> Value:
        """Apply scalar computation ``name`` elementwise to broadcastable arrays, all elements at once.

        When every instruction of the computation is elementwise (see :data:`ELEMENTWISE`) it runs once on
        the whole arrays; otherwise it is called once per element (correct, slower).

        Args:
            name: a computation whose parameters and result are scalars (or tuples of scalars).
            arrays: one array per parameter, each with that parameter's element type.

        Returns:
            An array of the broadcast shape (a tuple of them for a tuple-shaped root).
        """
        plan = self._plans.get(name)
        arrays = [np.asarray(a) for a in arrays]
        if len(arrays) != len(plan.param_slots):
            raise EvaluationError(
                None, f"computation {name} takes {len(plan.param_slots)} arguments, {len(arrays)} were passed"
            )
        for i, (a, s) in enumerate(zip(arrays, plan.param_shapes)):
            why = check_value(a, s, dims=False)
            if why is not None:
                raise EvaluationError(None, f"argument {i} of computation {name}: {why}")
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        if plan.vectorizable:
            out = self.run(name, arrays, vectorized=True)
            return _broadcast_value(out, shape)
        return self._per_element(name, arrays, shape, plan.computation.root_instruction.shape)

    def _per_element(self, name: str, arrays: list[np.ndarray], shape: tuple[int, ...], root: AnyShape) -> Value:
        leaves = root.leaves() if isinstance(root, TupleShape) else [root]
        outs = [np.empty(shape, dtype=s.element_type.dtype) for s in leaves]
        full = [np.broadcast_to(a, shape) for a in arrays]
        for index in np.ndindex(*shape):
            res = self.run(name, [a[index] for a in full])
            flat = _flatten(res)
            for o, r in zip(outs, flat):
                o[index] = r
        return _unflatten(root, iter(outs)) if isinstance(root, TupleShape) else outs[0]

    def operand_shape(self, instr: Instruction, i: int) -> AnyShape:
        """The declared shape of operand ``i`` of ``instr`` (in the computation now running)."""
        if self.computation is None or instr.operands[i] not in self.computation:
            raise EvaluationError(instr, f"operand {i} (%{instr.operands[i]}) has no known shape here")
        return self.computation[instr.operands[i]].shape


def _broadcast_value(value: Value, shape: tuple[int, ...]) -> Value:
    if isinstance(value, tuple):
        return tuple(_broadcast_value(v, shape) for v in value)
    assert isinstance(value, np.ndarray)
    return value if value.shape == shape else np.broadcast_to(value, shape).copy()


def _flatten(value: Value) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in _flatten(v)]
    if isinstance(value, Token):
        return []
    return [value]


def _unflatten(shape: AnyShape, leaves: Any) -> Value:
    if isinstance(shape, TupleShape):
        return tuple(_unflatten(e, leaves) for e in shape.elements)
    return TOKEN if shape.element_type.dtype is None else next(leaves)


def _unsupported(instr: Instruction) -> UnsupportedOpcodeError:
    return UnsupportedOpcodeError(
        instr,
        f"the reference interpreter has no function for opcode {instr.opcode!r}; "
        f"supported opcodes: {', '.join(sorted(REFERENCE))}",
    )


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------
def evaluate_instruction(
    ctx: EvalContext, computation: Computation, instr: Instruction, args: Sequence[Value]
) -> Value:
    """Evaluate one instruction on operand values (the compiler's fallback path).

    Args:
        ctx: the evaluation context (its module must hold the computations ``instr`` calls).
        computation: the computation ``instr`` belongs to (for operand shapes).
        instr: the instruction.
        args: one value per operand.

    Returns:
        The instruction's value, checked against its declared shape.
    """
    fn = REFERENCE.get(instr.opcode)
    step = _Step(instr, fn, (), 0, ())
    saved, ctx.computation = ctx.computation, computation
    try:
        with np.errstate(all="ignore"):
            return ctx._execute(step, list(args), False)
    finally:
        ctx.computation = saved


def _check_inputs(module: Module, inputs: Sequence[Any], device: str = "") -> list[Value]:
    params = module.entry_computation.parameters
    if len(inputs) != len(params):
        raise InputError(
            f"{module.name}{device}: the entry computation {module.entry} takes {len(params)} inputs "
            f"({', '.join(f'%{p.name}: {p.shape}' for p in params)}), {len(inputs)} were given"
        )
    out: list[Value] = []
    for p, value in zip(params, inputs):
        if isinstance(p.shape, Shape) and p.shape.element_type.dtype is None and value is None:
            value = TOKEN
        value = _as_value(value)  # a numpy scalar is a 0-d array of its exact dtype
        why = check_value(value, p.shape)
        if why is not None:
            number = p.attr("parameter_number")
            raise InputError(f"{module.name}{device}: parameter {number} (%{p.name}: {p.shape}): {why}")
        out.append(value)
    return out


def _flat_outputs(value: Value) -> list[np.ndarray]:
    return _flatten(value)


def evaluate(
    module: Module,
    inputs: Sequence[Any],
    *,
    host: Host | None = None,
    state: DeviceState | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[np.ndarray]:
    """Run ``module``'s entry computation on one device (replica 0, partition 0).

    Args:
        module: the HLO module.
        inputs: one value per entry parameter, in parameter order; arrays (or numpy scalars) must match the
            parameter's dimensions and numpy dtype exactly (tuple parameters take tuples, token parameters
            None or TOKEN).
        host: infeed/outfeed/send/recv queues; a fresh empty :class:`Host` when None.
        state: device state kept between calls (the RNG state); fresh when None.
        max_steps: ``while`` iterations the run may take, summed over every while (see :mod:`tpusim.limits`).

    Returns:
        The root value flattened depth-first (a non-tuple root gives a one-element list; tokens are dropped).

    Raises:
        RunLimitError: past ``max_steps`` iterations, naming the while that was running.
    """
    check_limits(max_steps)
    devices = module.replica_count * module.num_partitions
    if devices != 1:
        raise InputError(
            f"{module.name} is a program for {module.replica_count} replicas x {module.num_partitions} partitions; "
            f"run it with evaluate_spmd (command line: --replicas {devices})"
        )
    values = _check_inputs(module, inputs)
    ctx = EvalContext(module, host=host, state=state, max_steps=max_steps)
    try:
        with np.errstate(all="ignore"):
            return _flat_outputs(ctx.run(module.entry, values))
    except KeyboardInterrupt as exc:  # Ctrl-C: say where (the CLI prints it in one line)
        note_interrupt(exc, ctx.position())
        raise


def evaluate_spmd(
    module: Module,
    per_device_inputs: Sequence[Sequence[Any]],
    *,
    num_devices: int | None = None,
    host: Sequence[Host] | None = None,
    timeout: float | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[list[np.ndarray]]:
    """Run ``module`` on N devices in lockstep: one thread per device, collectives meet in a rendezvous.

    Device ``d`` is replica ``d // num_partitions``, partition ``d % num_partitions`` (XLA's flattened id).

    Args:
        module: the HLO module (per-device program: SPMD-partitioned or replicated).
        per_device_inputs: for each device, its inputs as for :func:`evaluate`.
        num_devices: devices to run; default ``replica_count x num_partitions`` of the module, or the number
            of input lists. Must be a multiple of ``num_partitions``; the quotient is the replica count.
        host: one :class:`Host` per device (fresh empty ones when None).
        timeout: seconds a device may wait at a collective before the run fails (None: wait, relying on the
            exact deadlock detection).
        max_steps: ``while`` iterations each device may take (see :func:`evaluate`).

    Returns:
        For each device, its flattened outputs.
    """
    check_limits(max_steps)
    from tpusim.compiler.hlo.reference.exchange import Exchange, run_devices

    n = num_devices if num_devices is not None else len(per_device_inputs)
    partitions = module.num_partitions
    if n < 1 or n % partitions:
        raise InputError(f"{module.name}: {n} devices cannot hold {partitions} partitions (need a multiple)")
    if len(per_device_inputs) != n:
        raise InputError(f"{module.name}: {n} devices but inputs for {len(per_device_inputs)} devices")
    if host is not None and len(host) != n:
        raise InputError(f"{module.name}: {n} devices but {len(host)} host queues")
    replicas = n // partitions
    values = [_check_inputs(module, inp, f" (device {d})") for d, inp in enumerate(per_device_inputs)]
    plans = _PlanCache(module)
    exchange = Exchange(n, timeout=timeout)
    contexts = [
        EvalContext(
            module,
            replica_id=d // partitions,
            partition_id=d % partitions,
            num_replicas=replicas,
            num_partitions=partitions,
            host=host[d] if host is not None else None,
            exchange=exchange,
            plans=plans,
            max_steps=max_steps,
        )
        for d in range(n)
    ]

    def body(d: int) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return _flat_outputs(contexts[d].run(module.entry, values[d]))

    try:
        return run_devices(exchange, body)
    except KeyboardInterrupt as exc:  # Ctrl-C: stop the other devices at their next iteration, say where
        for ctx in contexts:
            ctx.cancelled = True
        exchange.fail(-1)  # and release those waiting at a collective
        note_interrupt(exc, contexts[0].position())
        raise
