"""rng-bit-generator (bit-exact with XLA for ThreeFry and Philox) and rng (deterministic, not bit-exact).

``rng-bit-generator(state), algorithm=...`` returns ``(new_state, bits)`` (or the bits alone, XLA:TPU's
compiled form when the new state is unused). XLA specifies the bits of its
two algorithms (Operation Semantics, "RngBitGenerator"; the expansion is XLA's ``RngBitGeneratorExpander``
over ``prng.cc``, Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):

* ``rng_three_fry``: state ``u64[2+]`` = (key, counter). 32-bit (and narrower) outputs split one
  dimension in halves (the first even one, else the largest) and fill the two halves' interleaved
  positions from the two ThreeFry-2x32 output words of counter ``counter + i`` (``i`` the row-major index
  in the half shape); 64-bit outputs use both words of counter ``counter + i``. The counter advances
  by the number of ThreeFry blocks.
* ``rng_philox``: state ``u64[3]`` = (key, counter_lo, counter_hi) or ``u64[2]`` = (key, counter), in
  which case the 128-bit counter is (counter, key) and only its low word is returned. Philox-4x32-10 of
  the counter + i gives 4 words per block, used in order (two u64 per block for 64-bit outputs).
* ``rng_default`` is Philox, the algorithm XLA's CPU and GPU backends choose (TPU's default is not public).

Narrower outputs take the low bits of the 32-bit words; float outputs are the bits reinterpreted.

``rng(a, b), distribution=rng_uniform|rng_normal`` has no bit-level specification in XLA (backends seed it
from a hidden per-module state). Here it draws Philox-4x32 blocks keyed with 0 from the context's 128-bit
``rng_state`` (the same state ``rng-get-and-update-state`` reads), advancing it by the blocks used:
deterministic run to run, statistically uniform/normal, but NOT equal to XLA's numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register
from tpusim.memory import Shape

__all__ = ["philox4x32", "philox_bits", "rng_bit_generator", "threefry2x32", "threefry_bits"]

_M32 = np.uint64(0xFFFFFFFF)


def _rotl(v: np.ndarray, d: int) -> np.ndarray:
    return (v << np.uint32(d)) | (v >> np.uint32(32 - d))


def threefry2x32(key: tuple[np.ndarray, np.ndarray], x: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds on uint32 arrays (key words broadcast against the counters)."""
    k0, k1 = (np.asarray(k, np.uint32) for k in key)
    k2 = np.uint32(0x1BD11BDA) ^ k0 ^ k1
    ks = (k0, k1, k2)
    x0 = np.atleast_1d(np.asarray(x[0], np.uint32)) + k0
    x1 = np.atleast_1d(np.asarray(x[1], np.uint32)) + k1
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    for block in range(5):
        for r in rotations[block % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def philox4x32(key: tuple[np.ndarray, np.ndarray], x: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Philox-4x32 with 10 rounds on uint32 arrays."""
    k0, k1 = (np.asarray(k, np.uint32) for k in key)
    v = [np.atleast_1d(np.asarray(w, np.uint32)) for w in x]
    for _ in range(10):
        p0 = v[0].astype(np.uint64) * np.uint64(0xD2511F53)
        p1 = v[2].astype(np.uint64) * np.uint64(0xCD9E8D57)
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _M32).astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _M32).astype(np.uint32)
        v = [hi1 ^ v[1] ^ k0, lo1, hi0 ^ v[3] ^ k1, lo0]
        k0 = k0 + np.uint32(0x9E3779B9)
        k1 = k1 + np.uint32(0xBB67AE85)
    return tuple(v)


def _split_u64(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(v, np.uint64)
    return (v & _M32).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)


def _join_u64(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))


def _split_halves(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """XLA's SplitShapeIntoHalves: the split dimension and the half shape (``ceil(d/2)`` there)."""
    if not shape:
        return 0, (1,)
    split = next((i for i, d in enumerate(shape) if d % 2 == 0), None)
    if split is None:
        split = max(range(len(shape)), key=lambda i: (shape[i], -i))
    half = list(shape)
    half[split] = (shape[split] + 1) // 2
    return split, tuple(half)


def threefry_bits(key: int, counter: int, shape: tuple[int, ...], bits: int) -> tuple[np.ndarray, int]:
    """ThreeFry random bits of width ``bits`` (8, 16, 32 or 64) and the new counter."""
    k = _split_u64(np.array([key], np.uint64))
    if bits == 64:
        n = prod(shape)
        ctr = np.uint64(counter) + np.arange(n, dtype=np.uint64)
        o0, o1 = threefry2x32(k, _split_u64(ctr))
        return _join_u64(o0, o1).reshape(shape), (counter + n) % (1 << 64)
    split, half = _split_halves(shape)
    n = prod(half)
    ctr = np.uint64(counter) + np.arange(n, dtype=np.uint64)
    o0, o1 = threefry2x32(k, _split_u64(ctr))
    if not shape:
        out = o0[:1].reshape(())
    else:
        h = [x.reshape(half) for x in (o0, o1)]
        both = np.stack(h, axis=split + 1)  # half[split], 2 adjacent
        full = list(half)
        full[split] = 2 * half[split]
        out = both.reshape(full)
        out = out[tuple(slice(0, d) for d in shape)]
    return _narrow(out, bits), (counter + n) % (1 << 64)


def philox_bits(key: int, counter: int, shape: tuple[int, ...], bits: int) -> tuple[np.ndarray, int]:
    """Philox random bits of width ``bits`` from the 128-bit ``counter``, and the new 128-bit counter."""
    n = prod(shape)
    words = 2 * n if bits == 64 else n
    blocks = -(-words // 4)
    k = _split_u64(np.array([key], np.uint64))
    lo, hi = np.uint64(counter & 0xFFFFFFFFFFFFFFFF), np.uint64(counter >> 64)
    i = np.arange(blocks, dtype=np.uint64)
    new_lo = lo + i
    new_hi = np.where(new_lo < lo, hi + np.uint64(1), hi).astype(np.uint64)
    out = philox4x32(k, [*_split_u64(new_lo), *_split_u64(new_hi)])
    if bits == 64:
        pairs = np.stack([_join_u64(out[0], out[1]), _join_u64(out[2], out[3])], axis=1).reshape(-1)
        values = pairs[:n]
    else:
        values = _narrow(np.stack(out, axis=1).reshape(-1)[:n], bits)
    return values.reshape(shape), (counter + blocks) % (1 << 128)


def _narrow(u32: np.ndarray, bits: int) -> np.ndarray:
    return u32 if bits == 32 else u32.astype(np.dtype(f"u{bits // 8}"))


def rng_bit_generator(
    state: np.ndarray, algorithm: str, shape: tuple[int, ...], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """XLA's rng-bit-generator: ``(new_state, bits)`` for ``state`` (u64[N]) and output ``shape``/``dtype``."""
    dtype = np.dtype(dtype)
    bits = dtype.itemsize * 8
    if bits not in (8, 16, 32, 64) or dtype == np.bool_:
        raise ValueError(f"rng-bit-generator cannot produce {dtype}: 8, 16, 32 or 64-bit types only")
    st = [int(v) for v in np.asarray(state, np.uint64).reshape(-1)]
    alg = algorithm.lower()
    if alg in ("rng_default", "default"):
        alg = "rng_philox"
    if alg in ("rng_three_fry", "three_fry"):
        if len(st) < 2:
            raise ValueError(f"rng_three_fry needs a u64 state of at least 2 words, got {len(st)}")
        raw, ctr = threefry_bits(st[0], st[1], shape, bits)
        new = [st[0], ctr, *st[2:]]
    elif alg in ("rng_philox", "philox"):
        if len(st) < 2:
            raise ValueError(f"rng_philox needs a u64 state of 2 or 3 words, got {len(st)}")
        if len(st) >= 3:
            raw, ctr = philox_bits(st[0], st[1] | (st[2] << 64), shape, bits)
            new = [st[0], ctr & 0xFFFFFFFFFFFFFFFF, ctr >> 64, *st[3:]]
        else:
            raw, ctr = philox_bits(st[0], st[1] | (st[0] << 64), shape, bits)
            new = [st[0], ctr & 0xFFFFFFFFFFFFFFFF]
    else:
        raise ValueError(f"unknown rng algorithm {algorithm!r}; known: rng_default, rng_three_fry, rng_philox")
    return np.array(new, np.uint64), np.asarray(raw, order="C").view(dtype).reshape(shape)


@register("rng-bit-generator")
def _rng_bit_generator(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (state,) = args
    shape = instr.shape
    elems = getattr(shape, "elements", None)
    out = shape if isinstance(shape, Shape) else elems[1] if elems and len(elems) == 2 else None
    if (
        not isinstance(out, Shape)
        or out.element_type.dtype is None
        or not isinstance(state, np.ndarray)
        or state.dtype != np.uint64
        or state.ndim != 1
    ):
        raise EvaluationError(instr, "takes a u64[N] state and returns (u64[N], bits), or the bits alone")
    try:
        algorithm = str(instr.attr("algorithm", "rng_default"))
        new, bits = rng_bit_generator(state, algorithm, out.dimensions, out.element_type.dtype)
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None
    return bits if isinstance(shape, Shape) else (new, bits)


# ---------------------------------------------------------------------------------------------
# rng (unspecified bits)
# ---------------------------------------------------------------------------------------------
def _draw(ctx: EvalContext, n: int) -> np.ndarray:
    """``n`` uint32 words from Philox keyed 0 at the context's rng_state (advanced past them)."""
    bits, ctx.rng_state = philox_bits(0, int(ctx.rng_state), (n,), 32)
    return bits


def _unit(ctx: EvalContext, n: int, dtype: np.dtype) -> np.ndarray:
    """``n`` uniform floats in [0, 1) with the mantissa width of ``dtype`` (f64 for f64, else f32)."""
    if dtype == np.float64:
        w = _draw(ctx, 2 * n)
        u = _join_u64(w[0::2], w[1::2]) >> np.uint64(11)
        return u.astype(np.float64) * 2.0**-53
    return (_draw(ctx, n) >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


@register("rng")
def _rng(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) != 2 or not all(isinstance(a, np.ndarray) and a.ndim == 0 for a in args):
        raise EvaluationError(instr, "takes two scalar operands (low/high or mean/stddev)")
    a, b = args
    assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
    shape = instr.array_shape.dimensions
    dtype = instr.array_shape.element_type.dtype
    assert dtype is not None
    n = prod(shape)
    dist = str(instr.attr("distribution", "")).lower()
    is_float = dtype.kind in "fc" or dtype.kind == "V"
    if dist == "rng_uniform" and not is_float:
        if dtype == np.bool_ or dtype.kind not in "iu":
            raise EvaluationError(instr, f"rng_uniform of {dtype} is not supported")
        udt = np.dtype(f"u{dtype.itemsize}")
        span = (b.astype(dtype).view(udt) - a.astype(dtype).view(udt)).astype(np.uint64)
        if span == 0:
            raise EvaluationError(instr, "rng_uniform with an empty integer range [a, b)")
        w = _draw(ctx, 2 * n)
        r = _join_u64(w[0::2], w[1::2]) % span
        return (a.astype(dtype).view(udt) + r.astype(udt)).view(dtype).reshape(shape)
    wide = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    if dist == "rng_uniform":
        u = _unit(ctx, n, wide)
        lo, span = float(a.astype(wide)), float(b.astype(wide)) - float(a.astype(wide))
        return (u * wide.type(span) + wide.type(lo)).astype(dtype).reshape(shape)
    if dist == "rng_normal":
        half = -(-n // 2)
        u1 = np.maximum(_unit(ctx, half, wide), wide.type(1e-7))
        u2 = _unit(ctx, half, wide)
        r = np.sqrt(wide.type(-2.0) * np.log(u1))
        z = np.concatenate([r * np.sin(wide.type(2 * np.pi) * u2), r * np.cos(wide.type(2 * np.pi) * u2)])[:n]
        return (a.astype(wide) + b.astype(wide) * z).astype(dtype).reshape(shape)
    raise EvaluationError(instr, f"unknown distribution {dist!r}; known: rng_uniform, rng_normal")
