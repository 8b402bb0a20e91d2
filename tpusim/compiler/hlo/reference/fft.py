"""fft: FFT, IFFT, RFFT and IRFFT over the trailing ``len(fft_length)`` dimensions.

Semantics (Operation Semantics, "Fft"): FFT and IFFT are complex-to-complex (IFFT scaled by 1/N); RFFT
takes a real operand and returns the ``n/2 + 1`` non-negative frequencies of the last dimension; IRFFT
takes those and returns a real array whose trailing dimensions are ``fft_length`` (the imaginary parts
of the DC and Nyquist terms are ignored, as for any Hermitian input). The transforms run in double
precision (numpy's pocketfft) and round once to the result type, so the oracle is correctly rounded to
within a few ulp; XLA CPU computes in the operand precision (tolerance in the tests' table).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register

__all__ = ["fft"]


def fft(x: np.ndarray, fft_type: str, fft_length: Sequence[int], result: np.dtype) -> np.ndarray:
    """XLA fft of ``x``; ``result`` is the result's numpy dtype."""
    k = len(fft_length)
    if not 1 <= k <= 3 or k > x.ndim:
        raise ValueError(f"fft_length {list(fft_length)} must name 1 to 3 trailing dimensions (operand rank {x.ndim})")
    axes = tuple(range(x.ndim - k, x.ndim))
    s = tuple(int(n) for n in fft_length)
    t = fft_type.upper()
    out: np.ndarray
    if t in ("FFT", "IFFT"):
        if tuple(x.shape[-k:]) != s:
            raise ValueError(f"{t} of trailing dimensions {list(x.shape[-k:])} with fft_length {list(s)}")
        xw = x.astype(np.complex128)
        out = np.fft.fftn(xw, axes=axes) if t == "FFT" else np.fft.ifftn(xw, axes=axes)
    elif t == "RFFT":
        if tuple(x.shape[-k:]) != s:
            raise ValueError(f"RFFT of trailing dimensions {list(x.shape[-k:])} with fft_length {list(s)}")
        out = np.fft.rfftn(x.astype(np.float64), axes=axes)
    elif t == "IRFFT":
        want = (*s[:-1], s[-1] // 2 + 1)
        if tuple(x.shape[-k:]) != want:
            raise ValueError(f"IRFFT of trailing dimensions {list(x.shape[-k:])} needs {list(want)} for {list(s)}")
        out = np.fft.irfftn(x.astype(np.complex128), s=s, axes=axes)
    else:
        raise ValueError(f"unknown fft_type {fft_type!r}; known: FFT, IFFT, RFFT, IRFFT")
    return out.astype(result)


@register("fft")
def _fft(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (x,) = args
    if not isinstance(x, np.ndarray):
        raise EvaluationError(instr, "operand must be an array")
    result = instr.array_shape.element_type.dtype
    assert result is not None
    try:
        return fft(x, str(instr.attr("fft_type", "FFT")), tuple(instr.attr("fft_length", ())), result)
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None
