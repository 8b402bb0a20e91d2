"""Inputs and outputs of reference runs as ``.npz`` files, seeded random inputs, and ``tpusim run --reference``.

Conventions:

* Inputs are keyed ``arg0 .. argN-1`` in entry parameter order; a tuple-shaped parameter has one key per
  leaf, ``arg<i>.<j>[.<k>...]``; token parameters take no key. Outputs (the root flattened depth first)
  are ``out0 .. outM-1``; values of ``outfeed`` instructions follow as ``outfeed0 ..`` (arrays only).
* Element types an ``.npz`` cannot hold are written as the smallest standard type that holds every
  value exactly: bf16 and the f8/f4 types as float32; s2/s4 as int8, u2/u4 as uint8.
  On input they are accepted as float32/float64 (rounded to nearest even, as ``convert`` does; a finite
  value that would overflow to inf or NaN is refused), as the
  raw bit pattern of the same width (uint16 for bf16, uint8 for f8), or as int8/uint8/int32... values
  in range for sub-byte integers. Every other type must be given in its exact numpy dtype: tpusim never
  converts silently.
* With ``num_devices`` N > 1 every input and output has a leading axis of size N (device ``d`` is
  replica ``d // partitions``, partition ``d % partitions``).
* Random inputs (no ``--inputs``): ``numpy.random.default_rng([seed, device, parameter])`` per array, so
  the values do not depend on other parameters; floats standard normal (f8/f4 types clipped into their
  finite range), signed integers uniform in [-8, 8], unsigned in [0, 16], pred fair coin flips, complex
  numbers normal real and imaginary parts. The default seed is 0.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zipfile
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import ml_dtypes
import numpy as np

from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.reference.core import TOKEN, Host, Value, evaluate, evaluate_spmd
from tpusim.errors import TpusimError
from tpusim.limits import DEFAULT_MAX_STEPS
from tpusim.memory import AnyShape, ElementType, Shape, TupleShape, element_type_of_dtype
from tpusim.paths import regular_file_problem

__all__ = [
    "DEFAULT_SEED",
    "InputFileError",
    "OutputFileError",
    "configure_run_reference",
    "load_inputs",
    "random_inputs",
    "run_reference_command",
    "save_outputs",
    "storage_array",
]

DEFAULT_SEED = 0


class InputFileError(TpusimError):
    """An inputs file that does not fit the program (missing or extra key, wrong dtype or shape)."""


class OutputFileError(TpusimError):
    """An outputs file that cannot be written."""


# ---------------------------------------------------------------------------------------------
# Parameter leaves
# ---------------------------------------------------------------------------------------------
def _leaves(shape: AnyShape, key: str) -> list[tuple[str, Shape]]:
    """(npz key, array shape) of every array leaf of a parameter shape (tokens have none)."""
    if isinstance(shape, TupleShape):
        out: list[tuple[str, Shape]] = []
        for j, e in enumerate(shape.elements):
            out.extend(_leaves(e, f"{key}.{j}"))
        return out
    return [] if shape.element_type.dtype is None else [(key, shape)]


def _assemble(shape: AnyShape, key: str, arrays: dict[str, np.ndarray]) -> Value:
    if isinstance(shape, TupleShape):
        return tuple(_assemble(e, f"{key}.{j}", arrays) for j, e in enumerate(shape.elements))
    return TOKEN if shape.element_type.dtype is None else arrays[key]


def _parameter_keys(module: Module) -> list[tuple[str, Shape]]:
    out: list[tuple[str, Shape]] = []
    for i, p in enumerate(module.entry_computation.parameters):
        out.extend(_leaves(p.shape, f"arg{i}"))
    return out


def _storage_dtype(et: ElementType) -> np.dtype:
    """The standard numpy dtype an npz file stores values of ``et`` in (exactly)."""
    assert et.dtype is not None
    if et.dtype.kind != "V" and et.dtype.type.__module__ == "numpy":
        return et.dtype
    if et.kind == "float":
        return np.dtype(np.float32)
    return np.dtype(np.int8 if et.kind == "signed" else np.uint8)


def storage_array(value: np.ndarray) -> np.ndarray:
    """``value`` in a dtype an npz file holds exactly (see the module docstring)."""
    et = element_type_of_dtype(value.dtype)
    dt = _storage_dtype(et)
    return value if value.dtype == dt else value.astype(dt)


def _conversion(got: np.dtype, shape: Shape, where: str) -> str:
    """How an npz array of dtype ``got`` becomes the input ``shape`` by the rules of the module docstring:
    ``same``, ``round`` (floats rounded to a narrow float), ``bits`` (a raw bit pattern) or ``range``
    (integers checked against a narrow integer type's range); else raise InputFileError."""
    et = shape.element_type
    want = et.dtype
    assert want is not None
    if got.hasobject:
        raise InputFileError(f"{where}: an object array (pickled Python objects); tpusim reads only plain numeric "
                             f"arrays (allow_pickle stays off)")  # fmt: skip
    plain = got.fields is None and got.subdtype is None
    if got == want and plain:
        return "same"
    if _storage_dtype(et) != want and plain:  # a type npz cannot hold
        if et.kind == "float" and got in (np.float32, np.float64):
            return "round"  # rounded to nearest even by ml_dtypes, as XLA's convert
        if got.kind in "uV" and got.itemsize * 8 == et.bits:
            return "bits"  # raw bit pattern of the same width
        if et.kind in ("signed", "unsigned") and got.kind in "iu":
            return "range"
    accepted = {want.name}
    if _storage_dtype(et) != want:
        accepted |= {"float32", "float64"} if et.kind == "float" else {"int8", "uint8", "int32"}
        accepted.add(f"uint{et.bits}" if et.bits >= 8 else "uint8 (raw bits)")
    raise InputFileError(
        f"{where}: dtype {got} cannot be the {et.name} input; give {' or '.join(sorted(accepted))} "
        f"(tpusim never converts silently)"
    )


def _from_storage(array: np.ndarray, shape: Shape, where: str) -> np.ndarray:
    """Accept an npz array for ``shape`` by the rules of the module docstring, or raise InputFileError."""
    et = shape.element_type
    want = et.dtype
    assert want is not None
    how = _conversion(array.dtype, shape, where)
    if how == "round":
        with np.errstate(over="ignore"):
            rounded = array.astype(want)
        # (an overflow is a value that does not fit, as for integers: inf or, in types without inf, NaN)
        overflow = np.isfinite(array) & ~np.isfinite(rounded.astype(np.float32))
        if overflow.any():
            at = tuple(int(i) for i in np.argwhere(overflow)[0])
            finite = ml_dtypes.finfo(want).max
            raise InputFileError(
                f"{where}: {float(array[at]):g} at index {list(at)} does not fit {et.name} (largest finite value "
                f"{float(finite):g}); it would become {float(rounded[at])}"
            )
        return rounded
    if how == "bits":
        return array.view(et.raw_dtype).view(want)
    if how == "range":
        info = ml_dtypes.iinfo(want)
        lo, hi = (int(array.min()), int(array.max())) if array.size else (0, 0)
        if lo < int(info.min) or hi > int(info.max):
            raise InputFileError(f"{where}: values [{lo}, {hi}] do not fit {et.name} [{info.min}, {info.max}]")
        return array.astype(want)
    return array


# ---------------------------------------------------------------------------------------------
# Reading an npz from its headers first
# ---------------------------------------------------------------------------------------------
_NPY_MAGIC = b"\x93NUMPY"
_CHUNK = 1 << 20  # bytes inflated at a time


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _open_npz(path: Path) -> zipfile.ZipFile:
    """The zip archive of an npz file, after telling an empty file or a lone .npy array from a corrupt zip."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read an npz file: {exc.strerror or _short(exc)}") from None
    how = "write the inputs with numpy.savez(path, arg0=..., arg1=...)"
    if not head:
        raise InputFileError(f"{path}: the file is empty; give an .npz of arrays keyed arg0..argN-1 ({how})")
    if head == _NPY_MAGIC:
        raise InputFileError(f"{path}: a single .npy array, not an .npz of arrays keyed arg0..argN-1; {how}")
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise InputFileError(f"{path}: not an .npz file (a zip archive), or a truncated one: {_short(exc)}") from None


@dataclass(frozen=True)
class _Member:
    info: zipfile.ZipInfo
    dtype: np.dtype  # as stored (any byte order)
    shape: tuple[int, ...]
    fortran_order: bool
    offset: int  # where the array data starts in the member


def _read_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> _Member:
    """The .npy header of a member (inflating only its first bytes)."""
    try:
        with archive.open(info) as f:
            try:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
            except (ValueError, TypeError, SyntaxError) as exc:
                raise InputFileError(f"{where}: not a .npy array: {_short(exc)}") from None
            offset = f.tell()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError) as exc:
        raise InputFileError(f"{where}: corrupt member: {_short(exc)}") from None
    return _Member(info, np.dtype(dtype), tuple(int(d) for d in shape), bool(fortran), offset)


def _read_data(archive: zipfile.ZipFile, member: _Member, where: str) -> np.ndarray:
    """A member's array, inflated a chunk at a time into an array of its declared size (no more)."""
    dims = member.shape[::-1] if member.fortran_order else member.shape
    array = np.empty(dims, member.dtype)
    buffer = array.reshape(-1).view(np.uint8)
    try:
        with archive.open(member.info) as f:
            f.read(member.offset)
            done = 0
            while done < len(buffer):
                data = f.read(min(_CHUNK, len(buffer) - done))
                if not data:
                    raise InputFileError(f"{where}: truncated: its data ends after {done} of {len(buffer)} bytes")
                buffer[done : done + len(data)] = np.frombuffer(data, np.uint8)
                done += len(data)
            f.read(1)  # reach the end of the member, where zipfile checks its CRC
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError) as exc:
        raise InputFileError(f"{where}: corrupt member: {_short(exc)}") from None
    if member.fortran_order:
        array = array.transpose()
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def load_inputs(path: str | Path, module: Module, num_devices: int = 1) -> list[list[Value]]:
    """Read ``path`` (npz) into per-device entry inputs for ``module``.

    Args:
        path: the npz file (keys ``arg0 ..``; see the module docstring).
        module: the program.
        num_devices: N; for N > 1 every array has a leading axis of size N.

    Returns:
        For each device, its inputs in parameter order (ready for :func:`evaluate` / :func:`evaluate_spmd`).

    Raises:
        InputFileError: naming the file and the member: not an npz (empty, a lone .npy, a corrupt or truncated
            zip), missing or unexpected members, a dtype or shape the program does not take, object arrays
            (``allow_pickle`` stays off), a member whose size disagrees with its header, corrupt data. Names
            come from the zip directory and dtypes, shapes and sizes from the .npy headers before any array
            data is read, so a huge or bomb member is refused without inflating it; members the program does
            not take are never opened.
    """
    path = Path(path)
    problem = regular_file_problem(path)
    if problem:
        raise InputFileError(f"{path} {problem}")
    keys = _parameter_keys(module)
    with _open_npz(path) as archive:
        # 1. names from the zip directory, 2. dtypes, shapes and sizes from every .npy header, 3. the data
        members: dict[str, zipfile.ZipInfo] = {}
        for info in archive.infolist():
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if key in members:
                raise InputFileError(f"{path}: the archive holds {_clip([key])[0]} twice")
            members[key] = info
        missing = [k for k, _ in keys if k not in members]
        extra = sorted(set(members) - {k for k, _ in keys})
        if missing or extra:
            listing = ", ".join(f"{k}: {s}" for k, s in keys) or "none"
            parts = [f"missing {', '.join(missing)}"] if missing else []
            parts += [f"unexpected {', '.join(_clip(extra))}"] if extra else []
            raise InputFileError(f"{path}: {'; '.join(parts)} (the program takes {listing})")
        headers: dict[str, _Member] = {}
        for key, shape in keys:
            where = f"{path}: {key}"
            member = _read_header(archive, members[key], where)
            want = (num_devices, *shape.dimensions) if num_devices > 1 else shape.dimensions
            if member.shape != want:
                per = f" (a leading axis of {num_devices} devices, then {list(shape.dimensions)})"
                per = per if num_devices > 1 else ""
                raise InputFileError(
                    f"{path}: {key} has shape {list(member.shape)}, expected {list(want)}{per} for {shape}"
                )
            _conversion(member.dtype.newbyteorder("="), shape, where)
            declared = member.offset + math.prod(member.shape) * member.dtype.itemsize
            if member.info.file_size != declared:
                raise InputFileError(
                    f"{where}: the member holds {member.info.file_size} bytes but its header declares "
                    f"{member.dtype} {member.shape}: {declared} bytes"
                )
            headers[key] = member
        arrays = {key: _read_data(archive, headers[key], f"{path}: {key}") for key, _ in keys}
    per_device: list[dict[str, np.ndarray]] = [{} for _ in range(num_devices)]
    for key, shape in keys:
        a = _from_storage(arrays[key], shape, f"{path}: {key}")
        for d in range(num_devices):
            per_device[d][key] = a[d] if num_devices > 1 else a
    params = module.entry_computation.parameters
    return [[_assemble(p.shape, f"arg{i}", dev) for i, p in enumerate(params)] for dev in per_device]


def _clip(names: list[str], most: int = 8) -> list[str]:
    """At most ``most`` names (member names come from the file: keep the error's first line short)."""
    names = [n if len(n) <= 60 else n[:60] + "..." for n in names]
    return names if len(names) <= most else [*names[:most], f"... ({len(names) - most} more)"]


_DRAW = 1 << 16  # random values drawn at a time


def _random_array(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    """One array of random inputs, drawn ``_DRAW`` values at a time straight into an array of the program's
    dtype: the values are those of one draw of the whole array (numpy's generators continue their stream from
    call to call), without a float64 or int64 copy of the whole array on the way."""
    et = shape.element_type
    dt = et.dtype
    assert dt is not None
    out = np.empty(shape.dimensions, dt)
    flat = out.reshape(-1)
    n = flat.size

    def fill(target: np.ndarray, draw: Callable[[int], np.ndarray]) -> None:
        for s in range(0, n, _DRAW):
            k = min(_DRAW, n - s)
            target[s : s + k] = draw(k).astype(target.dtype)

    if et.kind == "pred":
        fill(flat, lambda k: rng.integers(0, 2, k))
    elif et.kind == "signed":
        fill(flat, lambda k: rng.integers(-8, 8, k, endpoint=True))
    elif et.kind == "unsigned":
        fill(flat, lambda k: rng.integers(0, 16, k, endpoint=True))
    elif et.kind == "complex":  # every real part, then every imaginary part
        fill(flat.real, rng.standard_normal)
        fill(flat.imag, rng.standard_normal)
    else:
        finite = float(ml_dtypes.finfo(dt).max) if et.bits <= 8 else None

        def normal(k: int) -> np.ndarray:
            values = rng.standard_normal(k)
            if finite is not None:
                values = np.clip(values, -finite, finite)
            return values.astype(np.float32)

        fill(flat, normal)
    return out


@overload
def random_inputs(module: Module, seed: int = ..., num_devices: int = ..., only: None = None) -> list[list[Value]]: ...


@overload
def random_inputs(
    module: Module, seed: int = ..., num_devices: int = ..., *, only: Collection[int]
) -> list[list[Value | None]]: ...


def random_inputs(
    module: Module, seed: int = DEFAULT_SEED, num_devices: int = 1, only: Collection[int] | None = None
) -> list[list[Value]] | list[list[Value | None]]:
    """Seeded random inputs for every device (see the module docstring for the ranges); with ``only``, the
    values of those parameters (each the same as without it) and None for the others."""
    params = module.entry_computation.parameters
    out = []
    for d in range(num_devices):
        arrays = {}
        for i, p in enumerate(params):
            if only is not None and i not in only:
                continue
            for j, (key, shape) in enumerate(_leaves(p.shape, f"arg{i}")):
                arrays[key] = _random_array(shape, np.random.default_rng([seed, d, i, j]))
        out.append(
            [_assemble(p.shape, f"arg{i}", arrays) if only is None or i in only else None for i, p in enumerate(params)]
        )
    return out


def save_outputs(path: str | Path, outputs: Sequence[np.ndarray], extra: dict[str, np.ndarray] | None = None) -> None:
    """Write ``outputs`` as ``out0 ..`` (plus ``extra`` keys) to exactly ``path`` (no ``.npz`` appended), in
    npz-storable dtypes."""
    arrays = {f"out{i}": storage_array(np.asarray(o)) for i, o in enumerate(outputs)}
    for k, v in (extra or {}).items():
        arrays[k] = storage_array(np.asarray(v))
    path = Path(path)
    # written through a file object, so numpy does not append ".npz" to a path without it: the file is exactly
    # ``path``; written to a temporary file first and renamed, so a failed write leaves no half file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputFileError(f"{path}: cannot write the outputs: {exc.strerror or exc}") from None


def stack_devices(per_device: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """Per-device output lists -> one array per output with a leading device axis."""
    return [np.stack([dev[i] for dev in per_device]) for i in range(len(per_device[0]))] if per_device else []


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def configure_run_reference(parser: argparse.ArgumentParser) -> None:
    """Add the arguments ``run_reference_command`` reads (for a parser of its own; ``tpusim run`` has them)."""
    parser.add_argument("program", type=Path, help="the HLO text file")
    parser.add_argument("--inputs", type=Path, help="npz with arg0..argN-1 (default: seeded random inputs)")
    parser.add_argument("--out", type=Path, default=Path("reports/out.npz"), help="npz to write out0..outM-1")
    parser.add_argument("--replicas", type=int, help="run N devices; inputs and outputs get a leading axis of N")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the random inputs (default 0)")


MAX_REFERENCE_DEVICES = 4096
"""Devices ``--reference`` evaluates at most (each its own inputs, values and thread of the interpreter): a
pod's worth; a header claiming a billion replicas is refused rather than drawn input by input."""


def run_reference_command(args: argparse.Namespace) -> int:
    """``tpusim run PROGRAM --reference [--inputs IN.npz] [--out OUT.npz] [--replicas N] [--seed S]
    [--max-steps N]``.

    Reads ``args.program``, ``args.inputs`` (optional), ``args.out``, ``args.replicas`` (optional),
    ``args.seed`` (optional) and ``args.max_steps`` (optional: while iterations allowed, see
    :mod:`tpusim.limits`); prints one line per output to stderr. Returns the exit status (0).
    """
    from tpusim.compiler.hlo import load_module
    from tpusim.paths import check_output_path, fresh_path

    given = getattr(args, "out", None)
    out = check_output_path(given or fresh_path("reports/out.npz"), "--out", folder=False)
    module = load_module(args.program)
    declared = module.replica_count * module.num_partitions
    replicas = getattr(args, "replicas", None)
    n = int(replicas) if replicas is not None else declared
    if n < 1:
        raise TpusimError(f"--replicas {n}: the number of devices must be at least 1")
    if n > MAX_REFERENCE_DEVICES:
        given = f"--replicas {n}" if replicas is not None else f"{module.name} runs on {n:,} devices"
        raise TpusimError(f"{given}: the reference interpreter evaluates every device in this process, at most "
                          f"{MAX_REFERENCE_DEVICES:,}")  # fmt: skip
    inputs_path = getattr(args, "inputs", None)
    seed = getattr(args, "seed", None)
    seed = DEFAULT_SEED if seed is None else int(seed)
    inputs = load_inputs(inputs_path, module, n) if inputs_path is not None else random_inputs(module, seed, n)
    stacked = n > 1 or replicas is not None
    max_steps = getattr(args, "max_steps", None)
    max_steps = DEFAULT_MAX_STEPS if max_steps is None else max_steps
    hosts = [Host() for _ in range(n)]
    if n == 1 and declared == 1:
        outputs: list[np.ndarray] = evaluate(module, inputs[0], host=hosts[0], max_steps=max_steps)
        per_device = [outputs]
    else:
        per_device = evaluate_spmd(module, inputs, num_devices=n, host=hosts, max_steps=max_steps)
    outputs = stack_devices(per_device) if stacked else per_device[0]
    feeds = [[v for v in h.outfeed if isinstance(v, np.ndarray)] for h in hosts]
    extra = {}
    for i in range(min(len(f) for f in feeds)):
        extra[f"outfeed{i}"] = np.stack([f[i] for f in feeds]) if stacked else feeds[0][i]
    save_outputs(out, outputs, extra)
    source = f"inputs {inputs_path}" if inputs_path is not None else f"random inputs (seed {seed})"
    print(f"reference: {args.program} on {n} device(s), {source} -> {out}", file=sys.stderr)
    for i, o in enumerate(outputs):
        print(f"  out{i}: {element_type_of_dtype(o.dtype).name}{list(o.shape)}", file=sys.stderr)
    return 0
