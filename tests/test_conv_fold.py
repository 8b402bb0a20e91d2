"""Weight gradients of ordinary convolutions with a window axis folded into their few input features
(tpusim/compiler/conv_fold.py): the same values as JAX's ``grad`` on CPU, the rewrite only where it applies,
and the copies it saves."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from e2e_support import run_checked

import tpusim
from tpusim.compiler import pipeline
from tpusim.compiler.conv_fold import fold_narrow_windows
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.ir import ConvDims
from tpusim.config import load_config

RNG = np.random.default_rng(0)


def _kernel_shape(shape: tuple[int, ...], window: tuple[int, ...], dims: tuple[str, ...], cout: int) -> list[int]:
    spatial = iter(window)
    return [{"I": shape[dims[0].index("C")], "O": cout}.get(letter) or next(spatial) for letter in dims[1]]


def _kernel_grad(x: np.ndarray, window: tuple[int, ...], padding: Any, dims: tuple[str, ...]) -> tuple[str, np.ndarray]:
    """The HLO of JAX's gradient of ``conv(x, k)`` with respect to a ``window`` kernel ``k`` of 6 output
    features (one convolution whose window is the image), and a cotangent for it."""
    k = np.zeros(_kernel_shape(x.shape, window, dims, 6), x.dtype)

    def conv(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (1,) * len(window), padding, dimension_numbers=dims)

    g = RNG.standard_normal(jax.eval_shape(conv, x, k).shape).astype(x.dtype)

    def f(x: jax.Array, g: jax.Array) -> jax.Array:
        return jax.grad(lambda k: jnp.sum((conv(x, k) * g).astype(jnp.float32)))(k)

    return jax.jit(f).lower(x, g).as_text(dialect="hlo"), g


def _convolutions(text: str) -> list[Any]:
    module = fold_narrow_windows(parse_module(text), load_config("tpu_v5e").vmem.bytes)
    return [i for c in module.computations for i in c.instructions if i.opcode == "convolution"]


@pytest.mark.parametrize(
    ("shape", "window", "padding", "dims", "dtype"),
    [
        ((4, 12, 12, 8), (3, 3), "SAME", ("NHWC", "HWIO", "NHWC"), ml_dtypes.bfloat16),
        ((2, 10, 9, 4), (3, 2), "VALID", ("NHWC", "HWIO", "NHWC"), np.float32),
        ((3, 6, 16, 16), (5, 5), ((2, 1), (0, 3)), ("NCHW", "OIHW", "NCHW"), np.float32),
        ((2, 40, 5), (4,), "SAME", ("NWC", "WIO", "NWC"), ml_dtypes.bfloat16),
    ],
)
def test_a_folded_weight_gradient_equals_the_reference(shape, window, padding, dims, dtype) -> None:
    x = RNG.standard_normal(shape).astype(dtype)
    text, g = _kernel_grad(x, window, padding, dims)
    convs = _convolutions(text)
    assert len(convs) == 1 and any(w.size == 1 for w in convs[0].attr("window").dims), "the window is folded"
    assert not run_checked(parse_module(text), [x, g], config="tpu_v5e").result.fallbacks
    run_checked(parse_module(text), [x, g], config="teaching")  # (too little VMEM to fold: the values still)


def test_a_forward_convolution_and_wide_features_are_left_alone() -> None:
    x = np.zeros((2, 16, 16, 8), np.float32)
    forward = jax.jit(
        lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    )
    text = forward.lower(x, np.zeros((3, 3, 8, 8), np.float32)).as_text(dialect="hlo")
    assert all(not any(w.size == 1 for w in c.attr("window").dims) for c in _convolutions(text))
    wide = np.zeros((64, 16, 16, 8), np.float32)  # 64 batch elements: the gradient's input features
    text, _ = _kernel_grad(wide, (3, 3), "SAME", ("NHWC", "HWIO", "NHWC"))
    (conv,) = _convolutions(text)
    assert isinstance(conv.attr("dim_labels"), ConvDims)
    assert all(w.size > 1 for w in conv.attr("window").dims)


def test_folding_a_weight_gradient_saves_most_of_its_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX's gradient of a 3x3 convolution of a bf16 [8,32,32,64] batch with respect to its kernel: its 1,024
    window taps of 8 features each were 2,048 vector copies of 8 lanes, 98,000 cycles of its kernel on v5e
    (XLA's estimate for it: 12,100)."""
    x = RNG.standard_normal((8, 32, 32, 64)).astype(ml_dtypes.bfloat16)
    text, _ = _kernel_grad(x, (3, 3), "SAME", ("NHWC", "HWIO", "NHWC"))
    folded = tpusim.simulate(text, config="tpu_v5e", timing_only=True)
    monkeypatch.setattr(pipeline, "fold_narrow_windows", lambda module, vmem_bytes: module)
    plain = tpusim.simulate(text, config="tpu_v5e", timing_only=True)
    assert folded.cycles < 0.6 * plain.cycles
