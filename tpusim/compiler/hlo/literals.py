"""Constant literals: ``constant({ {1, 2}, {3, 4} })`` to numpy and back, bit-exact.

The grammar is XLA's (xla/hlo/parser/hlo_parser.cc, ``ParseLiteral``/``ParseDenseLiteral``): a scalar is
one value, an array nests one ``{...}`` per dimension (commas separate values and are optional), a complex
value is ``(re, im)``, a tuple is ``(literal, literal, ...)``. Values are read in bulk: the body of an array
is split once and converted by numpy, so a constant of millions of elements costs a few numpy calls, not a
Python loop. Floats are parsed as doubles and rounded to the element type, as XLA does; ``nan``, ``-nan``,
``nan(0x<payload>)``, ``inf``, ``-inf`` and ``-0`` keep their exact bits.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from math import prod

import ml_dtypes
import numpy as np

from tpusim.compiler.hlo.ir import Literal
from tpusim.compiler.hlo.lexer import SourceText
from tpusim.compiler.hlo.shape_rules import compatible
from tpusim.errors import LayoutError
from tpusim.memory import AnyShape, ElementType, Shape, TupleShape, element_type, parse_shape

__all__ = ["ELIDED_HINT", "format_literal", "parse_literal", "written_shape"]

ELIDED_HINT = (
    "XLA printed this constant elided as {...}, so its value is not in the text; print the module with "
    "large constants: XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_text --xla_dump_large_constants', "
    "HloPrintOptions.print_large_constants=True, or from JAX jax.jit(f).lower(*args).as_text(dialect='hlo') "
    "(prints constants in full; compiled.as_text() elides them)"
)

_SCALAR = re.compile(r"[^\s,{}()]+(?:\(0x[0-9A-Fa-f]+\))?")
_COMPLEX = re.compile(r"\(\s*([^\s,{}()]+(?:\(0x[0-9A-Fa-f]+\))?)\s*,\s*([^\s,{}()]+(?:\(0x[0-9A-Fa-f]+\))?)\s*\)")
_BRACES = re.compile(r"[{}]")
_TOKEN_OR_BRACE = re.compile(r"[{}]|\([^()]*\)|[^\s{},()]+(?:\(0x[0-9A-Fa-f]+\))?")
_REAL_TOKEN = re.compile(r"[^\s{},]+")
_BLANKS = re.compile(r"[\s,]+")
_DELIMITERS = str.maketrans("{},", "   ")
# A shape written before the value; its layout, if any, touches the dimensions ("f32[2]{0} {1, 2}").
_TYPED_ARRAY = re.compile(r"[a-z][a-z0-9]*\[[0-9,<=?\s]*\](?:\{[^{}]*\})?")
_TYPED_TUPLE = re.compile(r"\(\s*[a-z][a-z0-9]*\[")
_NAN_PAYLOAD = re.compile(r"(-?)nan\(0x([0-9A-Fa-f]+)\)")


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
def parse_literal(src: SourceText, pos: int, shape: AnyShape) -> tuple[Literal, int]:
    """Read the literal of a constant of ``shape`` starting at ``pos``; returns (literal, end offset)."""
    pos = src.skip_ws(pos)
    text = src.text
    written = written_shape(src, pos)
    if written is not None:  # older XLA printed the shape inside the literal: constant(f32[2] {1, 2})
        if not compatible(written[0], shape):
            raise src.error(pos, f"the constant's value is written as {written[0]} but its shape is {shape}")
        pos = src.skip_ws(written[1])
    if isinstance(shape, TupleShape):
        pos = src.expect(pos, "(", f"to start a tuple literal of shape {shape}")
        elements = []
        for i, element_shape in enumerate(shape.elements):
            if i:
                pos = src.expect(pos, ",", f"between the elements of a tuple literal of shape {shape}")
            element, pos = parse_literal(src, pos, element_shape)
            elements.append(element)
        pos = src.expect(pos, ")", f"to end a tuple literal with {len(shape.elements)} elements")
        return Literal(shape, None, tuple(elements)), pos
    etype = shape.element_type
    if etype.dtype is None:
        raise src.error(pos, f"a constant cannot have element type {etype.name}")
    if text.startswith("{...}", pos):
        raise src.error(pos, ELIDED_HINT)
    if shape.rank == 0:
        if etype.is_complex:
            m = _COMPLEX.match(text, pos)
            if not m:
                raise src.error(pos, f"expected a complex value (re, im) for {shape}, found {src.found(pos)}")
            value = _complex_values(src, pos, [m.group(1)], [m.group(2)], etype)
        else:
            m = _SCALAR.match(text, pos)
            if not m:
                raise src.error(pos, f"expected a value of type {etype.name}, found {src.found(pos)}")
            value = _values(src, pos, [m.group(0)], etype)
        return Literal(shape, value.reshape(())), m.end()
    if not text.startswith("{", pos):
        raise src.error(pos, f"expected '{{' to start the value of a constant of shape {shape}, found {src.found(pos)}")
    end = _match_braces(src, pos)
    body = text[pos:end]
    if "..." in body:
        raise src.error(pos + body.index("...") - 1, ELIDED_HINT)
    if etype.is_complex:
        pairs = _COMPLEX.findall(body)
        skeleton_body = _COMPLEX.sub("x", body)
        _check_structure(src, pos, body, skeleton_body, shape, len(pairs))
        value = _complex_values(src, pos, [p[0] for p in pairs], [p[1] for p in pairs], etype)
    else:
        tokens = body.translate(_DELIMITERS).split()
        _check_structure(src, pos, body, None, shape, len(tokens))
        value = _values(src, pos, tokens, etype)
    return Literal(shape, value.reshape(shape.dimensions)), end


def written_shape(src: SourceText, pos: int) -> tuple[AnyShape, int] | None:
    """The shape an old-style typed literal starts with, and the offset after it (None if untyped)."""
    from tpusim.compiler.hlo.attributes import read_shape

    m = _TYPED_ARRAY.match(src.text, pos)
    if m:
        try:
            return parse_shape(m.group(0)), m.end()
        except LayoutError as err:
            raise src.error(pos + err.offset, err.message) from None
    if _TYPED_TUPLE.match(src.text, pos):
        return read_shape(src, pos)
    return None


def _match_braces(src: SourceText, pos: int) -> int:
    depth = 0
    for m in _BRACES.finditer(src.text, pos):
        if src.text[m.start()] == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return m.end()
    raise src.error(pos, "the '{' of this constant is never closed")


def _skeleton(dims: tuple[int, ...]) -> str:
    """The literal's text with values as ``x`` and blanks removed: ``{{xx}{xx}}`` for [2,2]."""
    return _small_skeleton(dims) if prod(dims) <= 4096 else _build_skeleton(dims)  # keep only small ones


@lru_cache(maxsize=256)
def _small_skeleton(dims: tuple[int, ...]) -> str:
    return _build_skeleton(dims)


def _build_skeleton(dims: tuple[int, ...]) -> str:
    inner = "{" + "x" * dims[-1] + "}"
    for d in reversed(dims[:-1]):
        inner = "{" + inner * d + "}"
    return inner


def _check_structure(src: SourceText, pos: int, body: str, skeleton_body: str | None, shape: Shape, count: int) -> None:
    dims = shape.dimensions
    if skeleton_body is None and len(dims) == 1:
        ok = count == dims[0] and body.count("{") == 1 and body.count("}") == 1
    else:
        sk = _REAL_TOKEN.sub("x", body) if skeleton_body is None else skeleton_body
        ok = _BLANKS.sub("", sk) == _skeleton(dims)
    if not ok:
        _diagnose(src, pos, body, shape)


def _diagnose(src: SourceText, pos: int, body: str, shape: Shape) -> None:
    """Walk the literal like XLA's parser and raise at the first value or brace that breaks the shape."""
    dims = shape.dimensions
    rank = len(dims)
    seen = [0] * rank
    level = 0
    for m in _TOKEN_OR_BRACE.finditer(body):
        at = pos + m.start()
        token = m.group(0)
        if token == "{":
            level += 1
            if level > rank:
                raise src.error(at, f"too many nested '{{' for a rank-{rank} constant of shape {shape}")
            if level > 1:
                seen[level - 2] += 1
                if seen[level - 2] > dims[level - 2]:
                    raise src.error(at, f"dimension {level - 2} of {shape} has {dims[level - 2]} entries, found more")
        elif token == "}":
            level -= 1
            if seen[level] != dims[level]:
                raise src.error(
                    at, f"dimension {level} of {shape} has {dims[level]} entries, found {seen[level]} before this '}}'"
                )
            seen[level] = 0
        else:
            if level != rank:
                raise src.error(at, f"a value at nesting depth {level}, but {shape} needs depth {rank}")
            seen[rank - 1] += 1
            if seen[rank - 1] > dims[rank - 1]:
                raise src.error(at, f"dimension {rank - 1} of {shape} has {dims[rank - 1]} entries, found more")
    raise src.error(pos, f"the constant's value does not have the shape {shape}")


def _bad_token(src: SourceText, pos: int, tokens: list[str], index: int, message: str) -> Exception:
    """Locate the ``index``-th value of the literal starting at ``pos`` and build the error there."""
    k = -1
    for m in _TOKEN_OR_BRACE.finditer(src.text, pos):
        if m.group(0) not in "{}":
            k += 1
            if k == index:
                return src.error(m.start(), message)
    return src.error(pos, message)


def _values(src: SourceText, pos: int, tokens: list[str], etype: ElementType) -> np.ndarray:
    dtype = etype.dtype
    assert dtype is not None
    if etype.kind == "pred":
        arr = np.array(tokens) if tokens else np.zeros(0, dtype="<U1")
        true = (arr == "true") | (arr == "1")
        valid = true | (arr == "false") | (arr == "0")
        if not valid.all():
            i = int(np.argmin(valid))
            raise _bad_token(src, pos, tokens, i, f"expected true, false, 1 or 0 for pred, found {tokens[i]!r}")
        return true
    if etype.is_integer:
        return _integers(src, pos, tokens, etype)
    return _floats(src, pos, tokens, etype)


def _integers(src: SourceText, pos: int, tokens: list[str], etype: ElementType) -> np.ndarray:
    dtype = etype.dtype
    assert dtype is not None
    info = _int_info(np.dtype(dtype))
    try:
        wide = np.array(tokens, dtype=np.uint64 if etype.name == "u64" else np.int64)
    except (ValueError, OverflowError):
        for i, tok in enumerate(tokens):
            try:
                value = int(tok)
            except ValueError:
                raise _bad_token(src, pos, tokens, i, f"expected an integer for {etype.name}, found {tok!r}") from None
            if not int(info.min) <= value <= int(info.max):
                break
        else:
            i = 0
        raise _bad_token(
            src, pos, tokens, i, f"value {tokens[i]} is out of range for {etype.name} [{info.min}, {info.max}]"
        ) from None
    if wide.size:
        low, high = wide.min(), wide.max()
        if int(low) < int(info.min) or int(high) > int(info.max):
            i = int(np.argmax((wide < info.min) | (wide > info.max)))
            raise _bad_token(
                src, pos, tokens, i, f"value {tokens[i]} is out of range for {etype.name} [{info.min}, {info.max}]"
            )
    return wide.astype(dtype)


@cache
def _int_info(dtype: np.dtype) -> ml_dtypes.iinfo | np.iinfo:
    try:
        return np.iinfo(dtype)
    except ValueError:
        return ml_dtypes.iinfo(dtype)


@cache
def _float_traits(dtype: np.dtype) -> tuple[bool, int, int, np.dtype]:
    """(IEEE-like with inf and NaN payloads, mantissa bits, total bits, raw unsigned dtype)."""
    nmant = int(ml_dtypes.finfo(dtype).nmant)
    with np.errstate(over="ignore", invalid="ignore"):
        ieee = bool(np.isinf(np.array([np.inf]).astype(dtype).astype(np.float64))[0])
    bits = dtype.itemsize * 8
    return ieee, nmant, bits, np.dtype(f"u{dtype.itemsize}")


def _floats(src: SourceText, pos: int, tokens: list[str], etype: ElementType) -> np.ndarray:
    dtype = etype.dtype
    assert dtype is not None
    payloads: list[tuple[int, bool, int]] = []
    if any("(" in t for t in tokens):
        tokens = list(tokens)
        for i, tok in enumerate(tokens):
            m = _NAN_PAYLOAD.fullmatch(tok)
            if m:
                payloads.append((i, bool(m.group(1)), int(m.group(2), 16)))
                tokens[i] = m.group(1) + "nan"
    try:
        wide = np.array(tokens, dtype=np.float64) if tokens else np.zeros(0)
    except ValueError:
        for i, tok in enumerate(tokens):
            try:
                float(tok)
            except ValueError:
                raise _bad_token(
                    src, pos, tokens, i, f"expected a floating-point value for {etype.name}, found {tok!r}"
                ) from None
        raise src.error(pos, f"cannot read the values of this {etype.name} constant") from None
    if dtype == np.float64:
        out = wide.copy()
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            out = wide.astype(dtype)
        back = out.astype(np.float64)
        overflow = np.isfinite(wide) & ~np.isfinite(back)
        if overflow.any():
            i = int(np.argmax(overflow))
            raise _bad_token(src, pos, tokens, i, f"value {tokens[i]} is out of range for {etype.name}")
    nans = np.isnan(wide)
    ieee, nmant, bits, raw = _float_traits(np.dtype(dtype))
    if ieee and nans.any():
        view = out.view(raw)
        exponent = ((1 << (bits - 1 - nmant)) - 1) << nmant
        sign = np.signbit(wide[nans]).astype(raw) << raw.type(bits - 1)
        view[nans] = sign | raw.type(exponent | (1 << (nmant - 1)))
        for i, negative, payload in payloads:
            if not 0 < payload < (1 << nmant):
                message = f"NaN payload 0x{payload:x} does not fit the {nmant}-bit mantissa of {etype.name}"
                raise _bad_token(src, pos, tokens, i, message)
            view[i] = raw.type(((1 << (bits - 1)) if negative else 0) | exponent | payload)
    elif payloads:
        raise _bad_token(src, pos, tokens, payloads[0][0], f"{etype.name} has no NaN payloads")
    return out


def _complex_values(
    src: SourceText, pos: int, re_tokens: list[str], im_tokens: list[str], etype: ElementType
) -> np.ndarray:
    dtype = etype.dtype
    assert dtype is not None
    part = element_type("f32" if etype.name == "c64" else "f64")
    real = _floats(src, pos, re_tokens, part)
    imag = _floats(src, pos, im_tokens, part)
    out = np.empty(real.shape, dtype=dtype)
    out.real = real
    out.imag = imag
    return out


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------
def format_literal(lit: Literal) -> str:
    """The literal in XLA's syntax, every value in full and exact (reads back to the same bits)."""
    if lit.value is None:
        return "(" + ", ".join(format_literal(e) for e in lit.tuple_elements) + ")"
    shape = lit.shape
    assert isinstance(shape, Shape)
    value = np.asarray(lit.value)
    flat = _strings(value.reshape(-1), shape.element_type)
    if shape.rank == 0:
        if shape.element_type.kind == "pred":
            return "true" if bool(value) else "false"
        return flat[0]
    return _nest(flat, shape.dimensions)


def _nest(flat: list[str], dims: tuple[int, ...]) -> str:
    """Group the flat values into one ``{...}`` per dimension, innermost first."""
    n = dims[-1]
    rows = ["{" + ", ".join(flat[i * n : (i + 1) * n]) + "}" for i in range(int(np.prod(dims[:-1])))]
    for k in range(len(dims) - 2, -1, -1):
        d = dims[k]
        rows = [
            "{ " + ", ".join(rows[i * d : (i + 1) * d]) + " }" if d else "{}" for i in range(int(np.prod(dims[:k])))
        ]
    return rows[0]


def _strings(flat: np.ndarray, etype: ElementType) -> list[str]:
    if etype.kind == "pred":
        return ["1" if v else "0" for v in flat.tolist()]
    if etype.is_integer:
        return [str(v) for v in flat.astype(np.uint64 if etype.name == "u64" else np.int64).tolist()]
    if etype.is_complex:
        part = np.float32 if etype.name == "c64" else np.float64
        re_s = _float_strings(np.asarray(flat.real, dtype=part, order="C"))
        im_s = _float_strings(np.asarray(flat.imag, dtype=part, order="C"))
        return [f"({a}, {b})" for a, b in zip(re_s, im_s)]
    return _float_strings(flat)


def _float_strings(flat: np.ndarray) -> list[str]:
    dtype = flat.dtype
    wide = flat if dtype in (np.float32, np.float64) else flat.astype(np.float32)
    out = [s[:-2] if s.endswith(".0") else s for s in wide.astype(str).tolist()]
    nans = np.flatnonzero(np.isnan(wide))
    if nans.size:
        ieee, nmant, bits, raw = _float_traits(np.dtype(dtype))
        view = flat.view(raw)
        for i in nans.tolist():
            b = int(view[i])
            sign = "-" if b >> (bits - 1) else ""
            payload = b & ((1 << nmant) - 1)
            quiet = 1 << (nmant - 1) if nmant else 0
            out[i] = f"{sign}nan" if not ieee or payload == quiet else f"{sign}nan(0x{payload:x})"
    return out
