"""Seeded mutation fuzzing of the whole pipeline over the shipped examples (``examples/*.hlo``).

A mutant is an example with one to three mutations applied (see :data:`MUTATORS`): bit flips in its bytes,
token deletions, swaps and replacements, a duplicated line, a truncation, a number replaced by a huge or
boundary value, a shape wrapped in deeply nested tuples. Each mutant goes the way a user's file goes: read
from disk, parsed, verified, printed, compiled, and where it compiles simulated timing-only. The one
acceptable failure is a :class:`tpusim.errors.TpusimError`; anything else (another exception, a worker that
dies, a mutant that runs past its time limit) is a finding. In check mode a mutant that runs is also run
numerically and compared with the reference interpreter: wrong outputs are findings too.

Mutants run in a separate worker process (:class:`MutantRunner`) with a wall-clock limit per mutant and a
cap on its memory, so a hang or a runaway allocation fails the mutant instead of blocking the caller; the
worker is restarted after each such failure. Mutant ``i`` of seed ``s`` depends only on ``(s, i)``, so one
mutant can be rebuilt and rerun alone (``scripts/fuzz_mutations.py --seed s --index i``).

Used by tests/test_mutation_fuzz.py (a bounded run) and scripts/fuzz_mutations.py (long runs).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import random
import re
import resource
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# The chip the mutants compile for: TPU v5e with a 32 MiB HBM (the examples need at most 6 MiB), so a mutant
# whose sizes grew a lot is refused by buffer assignment instead of costing the worker seconds and gigabytes.
CONFIG = "tpu_v5e"
OVERRIDES = ("hbm.bytes=33554432",)
MEMORY_CAP = 3 << 30  # bytes of address space a worker may add to what it has when it starts
STAGES = ("read", "parse", "verify", "print", "compile", "simulate", "check")
INTERNAL_ERRORS = frozenset(
    {"IsaError", "ExecutionError", "DeadlockError", "MemoryAccessError", "ProgramVerifyError", "PackError"}
)
# Run limits of each simulation: the examples execute at most 1,600 instructions, and a mutant cannot add
# loops of its own (the examples have none), so this only bounds a mutant's cost.
RUN_LIMITS = {"max_steps": 500_000}

TOKEN = re.compile(r"%?[A-Za-z_][A-Za-z0-9_.\-]*|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\s+|\"(?:[^\"\\]|\\.)*\"|.", re.S)
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
SHAPE = re.compile(r"\b[a-z][a-z0-9]*\[[0-9,?<=]*\](?:\{[^{}]*\})?")


def load_sources() -> dict[str, bytes]:
    """The shipped examples, by file name, as bytes."""
    return {p.name: p.read_bytes() for p in sorted(EXAMPLES.glob("*.hlo"))}


# -------------------------------------------------------------------------------------------- mutators
# Each mutator takes the mutant so far (bytes) and a random generator and returns the new bytes and a short
# description. Text mutators decode with surrogateescape so bytes an earlier flip made invalid survive.


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def flip_bits(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Flip one to four random bits."""
    if not data:
        return data, "flip (empty)"
    out = bytearray(data)
    where = []
    for _ in range(rng.randint(1, 4)):
        i, bit = rng.randrange(len(out)), rng.randrange(8)
        out[i] ^= 1 << bit
        where.append(f"{i}:{bit}")
    return bytes(out), f"flip bits {','.join(where)}"


def _tokens(data: bytes) -> tuple[list[str], list[int]]:
    tokens = TOKEN.findall(_text(data))
    return tokens, [i for i, t in enumerate(tokens) if not t.isspace()]


def delete_tokens(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Delete one to three consecutive tokens."""
    tokens, solid = _tokens(data)
    if not solid:
        return data, "delete (no tokens)"
    i = rng.choice(solid)
    n = rng.choice((1, 1, 1, 2, 3))
    gone = tokens[i : i + n]
    del tokens[i : i + n]
    return _bytes("".join(tokens)), f"delete tokens {i}..{i + n - 1} {''.join(gone)[:40]!r}"


def swap_tokens(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Swap two tokens, half the time two near each other (on one line, mostly)."""
    tokens, solid = _tokens(data)
    if len(solid) < 2:
        return data, "swap (too few tokens)"
    k = rng.randrange(len(solid))
    if rng.random() < 0.5:
        other = min(len(solid) - 1, max(0, k + rng.choice((-3, -2, -1, 1, 2, 3))))
    else:
        other = rng.randrange(len(solid))
    i, j = solid[k], solid[other]
    tokens[i], tokens[j] = tokens[j], tokens[i]
    return _bytes("".join(tokens)), f"swap tokens {i} {tokens[j][:20]!r} <-> {j} {tokens[i][:20]!r}"


def replace_token(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Replace a token by another token of the same file (an opcode by another opcode, a number by a number)."""
    tokens, solid = _tokens(data)
    if not solid:
        return data, "replace (no tokens)"
    i, j = rng.choice(solid), rng.choice(solid)
    old, tokens[i] = tokens[i], tokens[j]
    return _bytes("".join(tokens)), f"replace token {i} {old[:20]!r} -> {tokens[j][:20]!r}"


def duplicate_line(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Insert a copy of one line after itself or at another line."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    j = i + 1 if rng.random() < 0.5 else rng.randrange(len(lines) + 1)
    lines.insert(j, lines[i])
    return b"\n".join(lines), f"duplicate line {i + 1} at {j + 1}"


def truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Cut the file at a random byte."""
    cut = rng.randrange(len(data) + 1)
    return data[:cut], f"truncate at {cut}"


def _huge(rng: random.Random) -> str:
    digits = rng.choice((20, 40, 400, 4000))
    return (
        ("-" if rng.random() < 0.2 else "")
        + str(rng.randint(1, 9))
        + "".join(rng.choice("0123456789") for _ in range(digits - 1))
    )


BOUNDARY = ("0", "-1", str(2**31), str(2**31 - 1), str(2**32), str(2**63), str(2**63 - 1), str(2**64), "-" + str(2**63))


def replace_number(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Replace one number by a huge one (20 to 4,000 digits) or a boundary value (0, -1, 2^31, 2^63 ...)."""
    text = _text(data)
    spots = list(NUMBER.finditer(text))
    if not spots:
        return data, "number (none)"
    m = rng.choice(spots)
    new = _huge(rng) if rng.random() < 0.4 else rng.choice(BOUNDARY)
    shown = new if len(new) <= 24 else f"<{len(new)} digits>"
    return _bytes(text[: m.start()] + new + text[m.end() :]), f"number at {m.start()} {m.group(0)!r} -> {shown}"


def deep_tuple(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Wrap one shape in nested one-element tuples, 1 to 2,000 deep."""
    text = _text(data)
    spots = list(SHAPE.finditer(text))
    if not spots:
        return data, "tuple (no shapes)"
    m = rng.choice(spots)
    depth = rng.choice((1, 2, 5, 40, 300, 2000))
    wrapped = "(" * depth + m.group(0) + ")" * depth
    return _bytes(text[: m.start()] + wrapped + text[m.end() :]), f"tuple depth {depth} at {m.start()} {m.group(0)!r}"


# The mutators above mostly break the syntax, so few of their mutants get past the parser. The ones below keep
# it (a dimension resized everywhere it occurs, an element type or an opcode exchanged, a layout permuted or
# tiled), so their mutants reach the verifier, the compiler and the device model.
DIMENSION = re.compile(r"\[([0-9,]+)\]")
ELEMENT_TYPE = re.compile(r"\b(pred|bf16|[sufc]\d+[a-z0-9]*)(?=\[)")
LAYOUT = re.compile(r"\]\{([0-9,]+)\}")
RETYPES = tuple(
    ["pred", "s4", "s8", "s16", "s32", "s64", "u8", "u32", "f16", "bf16", "f32", "f64", "f8e4m3fn", "f8e5m2", "c64"]
)
TILES = (":T(8,128)", ":T(8,128)(2,1)", ":T(2,128)", ":T(1,128)", ":T(4,4)", ":T(8)", ":T(1)", ":T(3,5)")


def _opcodes() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from tpusim.compiler.hlo.opcodes import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE

    return tuple(sorted(UNARY_ELEMENTWISE)), tuple(sorted(BINARY_ELEMENTWISE))


def resize(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Replace one dimension size by another everywhere it occurs in square brackets (shapes, slice bounds),
    so the shapes mostly stay consistent."""
    text = _text(data)
    sizes = sorted({int(d) for m in DIMENSION.finditer(text) for d in m.group(1).split(",") if d})
    if not sizes:
        return data, "resize (no dimensions)"
    old = rng.choice(sizes)
    new = rng.choice((0, 1, 2, 3, 7, 8, 100, 129, 2 * old, max(1, old // 2), old + 1))
    number = re.compile(rf"(?<![\w.]){old}(?![\w.])")
    out = re.sub(r"\[[^\[\]\n]*\]", lambda m: number.sub(str(new), m.group(0)), text)  # inside [...] only
    return _bytes(out), f"resize {old} -> {new}"


def retype(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Exchange an element type: in every shape (the program stays consistent) or in one."""
    text = _text(data)
    spots = list(ELEMENT_TYPE.finditer(text))
    if not spots:
        return data, "retype (no shapes)"
    m = rng.choice(spots)
    new = rng.choice(RETYPES)
    if rng.random() < 0.5:
        out = re.sub(rf"\b{m.group(1)}(?=\[)", new, text)
        return _bytes(out), f"retype every {m.group(1)} -> {new}"
    return _bytes(text[: m.start()] + new + text[m.end() :]), f"retype at {m.start()} {m.group(1)} -> {new}"


def change_opcode(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Exchange one elementwise opcode for another of the same arity (or of the other arity)."""
    text = _text(data)
    unary, binary = _opcodes()
    spots = list(re.finditer(r"(?<=\s)([a-z][a-z\-]*)(?=\()", text))
    spots = [m for m in spots if m.group(1) in unary or m.group(1) in binary]
    if not spots:
        return data, "opcode (none)"
    m = rng.choice(spots)
    pool = unary if (m.group(1) in unary) != (rng.random() < 0.1) else binary
    new = rng.choice(pool)
    return _bytes(text[: m.start()] + new + text[m.end() :]), f"opcode at {m.start()} {m.group(1)} -> {new}"


def change_layout(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Permute one shape's minor-to-major order, or give it a tiling."""
    text = _text(data)
    spots = list(LAYOUT.finditer(text))
    if not spots:
        return data, "layout (none)"
    m = rng.choice(spots)
    dims = m.group(1).split(",")
    if rng.random() < 0.5 and len(dims) > 1:
        rng.shuffle(dims)
        new = "]{" + ",".join(dims) + "}"
    else:
        new = "]{" + m.group(1) + rng.choice(TILES) + "}"
    return _bytes(text[: m.start()] + new + text[m.end() :]), f"layout at {m.start()} {m.group(0)} -> {new}"


INT_ATTRIBUTE = re.compile(r"\b(dimensions|[a-z_]+_dims)=\{([0-9,\s-]*)\}")
WINDOW = re.compile(r"\b(window=\{[^{}\n]*\}|dim_labels=[0-9a-z_>-]+)")


def change_attribute(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Change one dimension-list attribute (``dimensions``, ``*_dims``: drop, add, repeat, permute or replace
    an entry, or empty it), a window's numbers or a convolution's dimension labels."""
    text = _text(data)
    spots = list(INT_ATTRIBUTE.finditer(text)) + list(WINDOW.finditer(text))
    if not spots:
        return data, "attribute (none)"
    m = rng.choice(spots)
    old = m.group(0)
    if old.startswith("window="):
        numbers = list(re.finditer(r"\d+", old))
        k = rng.choice(numbers)
        new = old[: k.start()] + rng.choice(("0", "1", "2", "5", "-1", "1000")) + old[k.end() :]
    elif old.startswith("dim_labels="):
        labels = list(old[len("dim_labels=") :])
        i, j = rng.randrange(len(labels)), rng.randrange(len(labels))
        labels[i], labels[j] = labels[j], labels[i]
        new = "dim_labels=" + "".join(labels)
    else:
        given = [d.strip() for d in m.group(2).split(",") if d.strip()]
        dims = list(given)
        how = rng.choice(("drop", "add", "repeat", "permute", "replace", "empty"))
        if how == "drop" and dims:
            dims.pop(rng.randrange(len(dims)))
        elif how == "repeat" and dims:
            dims.append(rng.choice(dims))
        elif how == "permute":
            rng.shuffle(dims)
        elif how == "replace" and dims:
            dims[rng.randrange(len(dims))] = rng.choice(("0", "1", "2", "3", "-1"))
        elif how == "empty":
            dims = []
        if dims == given:  # "add", or a change that changed nothing
            dims.insert(rng.randrange(len(dims) + 1), str(rng.randint(0, 4)))
        new = f"{m.group(1)}={{{','.join(dims)}}}"
    return _bytes(text[: m.start()] + new + text[m.end() :]), f"attribute at {m.start()} {old[:40]} -> {new[:40]}"


Mutator = Callable[[bytes, random.Random], tuple[bytes, str]]
MUTATORS: dict[str, Mutator] = {
    "flip": flip_bits,
    "delete": delete_tokens,
    "swap": swap_tokens,
    "replace": replace_token,
    "duplicate": duplicate_line,
    "truncate": truncate,
    "number": replace_number,
    "tuple": deep_tuple,
    "resize": resize,
    "retype": retype,
    "opcode": change_opcode,
    "layout": change_layout,
    "attribute": change_attribute,
}


@dataclass(frozen=True)
class Mutant:
    """One mutated example: ``index`` of ``seed`` (rebuilt by :func:`make_mutant`)."""

    seed: int
    index: int
    example: str
    mutations: tuple[str, ...]
    data: bytes

    @property
    def name(self) -> str:
        return f"mutant-{self.seed}-{self.index}"


def make_mutant(
    sources: dict[str, bytes], seed: int, index: int, mutators: tuple[str, ...] = tuple(MUTATORS)
) -> Mutant:
    """Mutant ``index`` of ``seed``: a deterministic function of both (and the sources and mutators)."""
    rng = random.Random(f"tpusim-mutation-{seed}-{index}")
    example = rng.choice(sorted(sources))
    data = sources[example]
    done = []
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
        name = rng.choice(mutators)
        data, what = MUTATORS[name](data, rng)
        done.append(what)
    return Mutant(seed, index, example, tuple(done), data)


def mutants(
    sources: dict[str, bytes], seed: int, count: int, start: int = 0, mutators: tuple[str, ...] = tuple(MUTATORS)
) -> Iterator[Mutant]:
    for i in range(start, start + count):
        yield make_mutant(sources, seed, i, mutators)


# -------------------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    """What one mutant did.

    Attributes:
        status: ``ok`` (simulated), ``error`` (a TpusimError), ``crash`` (another exception), ``hang`` (ran
            past the time limit), ``died`` (the worker process ended, e.g. killed for memory) or, in check mode,
            ``wrong`` (outputs unlike the reference interpreter's, or cycles unlike the timing-only run's).
        stage: the stage the mutant reached (one of :data:`STAGES`); for ``ok``, the last one run.
        error_type: the exception's module-qualified class name, if any.
        message: the first line of its message (at most 300 characters: its start and end).
        message_length: the length of that first line before cutting it.
        traceback: for a crash, the formatted traceback.
        where: for a crash, the innermost tpusim frame ``file:line (function)``: the root-cause key.
        seconds: wall time.
    """

    status: str
    stage: str
    error_type: str = ""
    message: str = ""
    message_length: int = 0
    traceback: str = ""
    where: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_internal(self) -> bool:
        """A TpusimError of the compiler's or the device model's own checks once the HLO verifier accepted the
        module: located, but about tpusim's internals, not the user's program (an unlowerable fused op's
        IsaError was a wrong answer elsewhere)."""
        return (
            self.status == "error"
            and self.stage in ("compile", "simulate", "check")
            and (self.error_type.rsplit(".", 1)[-1] in INTERNAL_ERRORS)
        )

    @property
    def is_finding(self) -> bool:
        return self.status in ("crash", "hang", "died", "wrong")

    @property
    def key(self) -> str:
        """The root-cause key findings are deduplicated by."""
        if self.status == "crash":
            return f"{self.error_type} at {self.where or '?'}"
        if self.status == "wrong":
            return "wrong " + ("outputs" if self.message.startswith("outputs") else "cycles")
        return f"{self.status} in {self.stage}"


def _clip(line: str, limit: int = 300) -> str:
    """``line``, or its start and end (where a device error says what failed) when longer than ``limit``."""
    return line if len(line) <= limit else f"{line[: limit // 2 - 3]} ... {line[-(limit // 2 - 2) :]}"


def _innermost_tpusim_frame(tb: Any) -> str:
    frames = [f for f in traceback.extract_tb(tb) if f"{os.sep}tpusim{os.sep}" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    rel = f.filename[f.filename.rindex(f"{os.sep}tpusim{os.sep}") + 1 :]
    return f"{rel}:{f.lineno} ({f.name})"


class _Pipeline:
    """The stages, run in the worker process; the config is loaded once."""

    def __init__(
        self,
        workdir: Path,
        overrides: tuple[str, ...] = OVERRIDES,
        run_limits: dict[str, Any] | None = None,
        progress: Any = None,
        check: bool = False,
    ) -> None:
        import inspect

        from tpusim.api import simulate
        from tpusim.config import load_config

        self.workdir = workdir
        self.progress = progress  # a shared integer: the index of the stage running, for a hang's report
        self.config = load_config(CONFIG, overrides=list(overrides))
        known = inspect.signature(simulate).parameters
        self.run_limits: dict[str, Any] = {
            k: v for k, v in (RUN_LIMITS if run_limits is None else run_limits).items() if k in known
        }
        self.check = check

    def run(self, name: str, data: bytes) -> Outcome:
        from tpusim.api import simulate
        from tpusim.compiler.hlo import load_module, print_module, verify_module
        from tpusim.compiler.pipeline import compile_module
        from tpusim.errors import TpusimError

        began = time.perf_counter()

        def enter(name: str) -> str:
            if self.progress is not None:
                self.progress.value = STAGES.index(name)
            return name

        stage = enter("read")
        try:
            path = self.workdir / f"{name}.hlo"
            path.write_bytes(data)
            stage = enter("parse")
            module = load_module(path, verify=False)
            stage = enter("verify")
            verify_module(module)
            stage = enter("print")
            print_module(module)
            stage = enter("compile")
            compiled = compile_module(module, self.config)
            stage = enter("simulate")
            timed = simulate(compiled, timing_only=True, **self.run_limits)
            if self.check:
                stage = enter("check")
                wrong = self._check(module, compiled, timed.cycles)
                if wrong:
                    return Outcome("wrong", stage, message=wrong[:300], seconds=time.perf_counter() - began)
            return Outcome("ok", stage, seconds=time.perf_counter() - began)
        except TpusimError as err:
            try:
                text = str(err)
            except Exception as fmt:  # formatting a TpusimError must not fail either
                return self._crash(stage, fmt, began)
            first = text.split("\n", 1)[0]
            kind = f"{type(err).__module__}.{type(err).__qualname__}"
            return Outcome("error", stage, kind, _clip(first), len(first), seconds=time.perf_counter() - began)
        except (Exception, RecursionError, MemoryError) as err:
            return self._crash(stage, err, began)

    def _check(self, module: Any, compiled: Any, timed_cycles: int) -> str:
        """Run numerically on seeded random inputs and compare with the reference interpreter (as ``tpusim run
        --check`` does) and the cycles with the timing-only run's: what differs, or ''."""
        from tpusim.api import simulate
        from tpusim.check import compare_outputs, emulate_one_pass
        from tpusim.compiler.hlo.reference import evaluate
        from tpusim.compiler.hlo.reference.io import random_inputs
        from tpusim.report.summary import program_precision

        inputs = random_inputs(module, 0)[0]
        result = simulate(compiled, inputs, **self.run_limits)
        precision = program_precision(compiled)
        exact = frozenset(name for _, name, opcode, _ in compiled.fallbacks if opcode in ("dot", "convolution"))
        oracle = emulate_one_pass(module, exact) if precision == "bf16" else module
        steps = {"max_steps": self.run_limits["max_steps"]} if "max_steps" in self.run_limits else {}
        reference = evaluate(oracle, list(inputs), **steps)
        bad = [str(c) for c in compare_outputs(result.outputs, reference, precision) if not c.ok]
        if bad:
            return "outputs differ from the reference interpreter: " + "; ".join(bad)
        if result.cycles != timed_cycles:
            return f"cycles differ: {result.cycles:,} numeric, {timed_cycles:,} timing-only"
        return ""

    @staticmethod
    def _crash(stage: str, err: BaseException, began: float) -> Outcome:
        first = (str(err) or "").split("\n", 1)[0]
        return Outcome(
            "crash",
            stage,
            f"{type(err).__module__}.{type(err).__qualname__}",
            _clip(first),
            len(first),
            "".join(traceback.format_exception(type(err), err, err.__traceback__)),
            _innermost_tpusim_frame(err.__traceback__),
            time.perf_counter() - began,
        )


def _worker(
    conn: Any,
    progress: Any,
    overrides: tuple[str, ...],
    run_limits: dict[str, Any] | None,
    memory_cap: int,
    check: bool,
) -> None:
    if memory_cap:
        with open("/proc/self/status") as f:
            size = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
        if size:
            resource.setrlimit(resource.RLIMIT_AS, (size + memory_cap, resource.RLIM_INFINITY))
    with tempfile.TemporaryDirectory(prefix="tpusim-mutants-") as tmp:
        pipeline = _Pipeline(Path(tmp), overrides, run_limits, progress, check)
        conn.send("ready")
        while True:
            try:
                job = conn.recv()
            except EOFError:
                return
            if job is None:
                return
            name, data = job
            outcome = pipeline.run(name, data)
            gc.collect()  # a run's memories sit in reference cycles: free them before the next mutant
            conn.send(outcome)


class MutantRunner:
    """Runs mutants one at a time in a worker process, each with a wall-clock limit.

    A mutant that runs past ``timeout`` seconds is a ``hang``; one during which the worker dies is
    ``died``. Either way the worker is killed and a fresh one started for the next mutant.
    """

    def __init__(
        self,
        timeout: float = 30.0,
        overrides: tuple[str, ...] = OVERRIDES,
        run_limits: dict[str, Any] | None = None,
        memory_cap: int = MEMORY_CAP,
        check: bool = False,
    ) -> None:
        self.timeout = timeout
        self.args = (overrides, run_limits, memory_cap, check)
        self.ctx = multiprocessing.get_context("spawn")
        self.process: Any = None
        self.conn: Any = None
        self.progress: Any = None

    def __enter__(self) -> MutantRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.progress = self.ctx.Value("i", 0, lock=False)
        self.process = self.ctx.Process(target=_worker, args=(child, self.progress, *self.args), daemon=True)
        self.process.start()
        child.close()
        self.conn = parent
        if not parent.poll(120) or parent.recv() != "ready":
            raise RuntimeError("the mutant worker did not start")

    def _kill(self) -> None:
        if self.process is not None and self.process.pid is not None:
            self.process.kill()
            self.process.join()
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None

    def close(self) -> None:
        if self.process is not None and self.process.pid is not None and self.process.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(5)
        self._kill()

    def run(self, mutant: Mutant) -> Outcome:
        if self.process is None or not self.process.is_alive():
            self._kill()
            self._start()
        began = time.perf_counter()
        self.conn.send((mutant.name, mutant.data))
        try:
            if self.conn.poll(self.timeout):
                outcome: Outcome = self.conn.recv()
                return outcome
            status, detail = "hang", f"no answer after {self.timeout:g} s"
        except EOFError:
            self.process.join(5)
            status, detail = "died", f"the worker died (exit code {self.process.exitcode})"
        stage = STAGES[self.progress.value]
        self._kill()
        return Outcome(status, stage, message=detail, seconds=time.perf_counter() - began)
