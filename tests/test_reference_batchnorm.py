"""batch-norm-training, -inference and -grad against XLA CPU on HLO text (JAX never emits them)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from heavy_checks import check_hlo

RNG = np.random.default_rng(7)  # reseeded for every test (conftest.py)


def _r(shape: tuple[int, ...], dtype: object, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale + shift).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("feature_index", [1, 3])
def test_batch_norm_training_inference_grad(dtype: object, feature_index: int) -> None:
    t = {np.float32: "f32", ml_dtypes.bfloat16: "bf16"}[dtype]  # type: ignore[index]
    shape = [2, 3, 4, 5]
    c = shape[feature_index]
    dims = ",".join(map(str, shape))
    text = f"""HloModule m
ENTRY e {{
  x = {t}[{dims}] parameter(0)
  scale = {t}[{c}] parameter(1)
  offset = {t}[{c}] parameter(2)
  mean = {t}[{c}] parameter(3)
  var = {t}[{c}] parameter(4)
  dy = {t}[{dims}] parameter(5)
  tr = ({t}[{dims}], {t}[{c}], {t}[{c}]) batch-norm-training(x, scale, offset), epsilon=0.001, feature_index={feature_index}
  bi = {t}[{dims}] batch-norm-inference(x, scale, offset, mean, var), epsilon=0.01, feature_index={feature_index}
  gr = ({t}[{dims}], {t}[{c}], {t}[{c}]) batch-norm-grad(x, scale, mean, var, dy), epsilon=0.001, feature_index={feature_index}
  ROOT out = (({t}[{dims}], {t}[{c}], {t}[{c}]), {t}[{dims}], ({t}[{dims}], {t}[{c}], {t}[{c}])) tuple(tr, bi, gr)
}}
"""  # noqa: E501
    x = _r(tuple(shape), dtype, 2.0, 1.0)
    var = np.abs(_r((c,), dtype)) + 0.5
    check_hlo(text, x, _r((c,), dtype), _r((c,), dtype), _r((c,), dtype), var.astype(dtype), _r(tuple(shape), dtype))
