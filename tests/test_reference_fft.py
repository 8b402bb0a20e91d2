"""fft (FFT, IFFT, RFFT, IRFFT in 1 to 3 dimensions) against JAX on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from heavy_checks import reference_of_text
from jax_oracle import check_against_jax

from tpusim.compiler.hlo.reference import EvaluationError

RNG = np.random.default_rng(6)  # reseeded for every test (conftest.py)


def _c(shape: tuple[int, ...], dtype: object = np.complex64) -> np.ndarray:
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("shape", [(8,), (3, 16), (2, 5, 6), (7,)])
def test_fft_and_ifft(shape: tuple[int, ...]) -> None:
    check_against_jax(lambda x: (jnp.fft.fft(x), jnp.fft.ifft(x)), _c(shape))


@pytest.mark.parametrize("n", [8, 9, 32])
def test_rfft_and_irfft(n: int) -> None:
    x = RNG.standard_normal((3, n)).astype(np.float32)
    check_against_jax(lambda a: (jnp.fft.rfft(a), jnp.fft.irfft(jnp.fft.rfft(a), n=n)), x)


def test_irfft_ignores_the_imaginary_part_of_dc_and_nyquist() -> None:
    check_against_jax(lambda a: jnp.fft.irfft(a, n=8), _c((2, 5)))


def test_fft2_fftn_and_their_inverses() -> None:
    x = RNG.standard_normal((2, 4, 6, 5)).astype(np.float32)
    check_against_jax(
        lambda a: (jnp.fft.fft2(a), jnp.fft.rfftn(a, axes=(1, 2, 3)), jnp.fft.irfft2(jnp.fft.rfft2(a), s=(6, 5))),
        x,
    )


def test_fft_c128() -> None:
    with jax.enable_x64(True):
        check_against_jax(lambda x: (jnp.fft.fft(x), jnp.fft.rfft(x.real)), _c((4, 12), np.complex128))


def test_wrong_fft_length_names_the_instruction() -> None:
    text = """HloModule m
ENTRY e {
  x = c64[4,8] parameter(0)
  ROOT f = c64[4,8] fft(x), fft_type=FFT, fft_length={8}
}
"""
    from tpusim.compiler.hlo import ir, parse_module
    from tpusim.compiler.hlo.reference import EvalContext, evaluate_instruction

    module = parse_module(text)
    comp = module.entry_computation
    instr = comp["f"]
    bad = ir.Instruction("f", "fft", instr.shape, instr.operands, instr.attributes.replace(fft_length=(6,)))
    message = r"^%f \(fft.*\): FFT of trailing dimensions \[8\] with fft_length \[6\]$"
    with pytest.raises(EvaluationError, match=message):
        evaluate_instruction(EvalContext(module), comp, bad, [_c((4, 8))])
    assert reference_of_text(text, _c((4, 8)))[0].dtype == np.complex64
