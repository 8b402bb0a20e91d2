"""XLA:TPU's NHWC convolutions store the activations ``{3,0,2,1}``: physical ``[H, W, N, C]``, the batch in the
sublanes of each ``(8,128)`` tile, below the spatial dimensions (and in VMEM, ``S(1)``). tpusim's convolution
cut its blocks one batch element at a time, so every block read one packed bf16 row of each tile: DMAs of
single elements (a 3x3 convolution of [8,56,56,64] took 1,069 us where XLA estimates 35.8). Its blocks now
keep a batch stored below the spatial dimensions whole.

The modules of ``tests/data/xla_conv_layouts/`` (``scripts/make_xla_conv_layouts.py``) are XLA:TPU's
compilations for v5e and v6e, stored with their inputs (small integers: every product and sum is exact),
JAX's outputs and XLA's time estimates, so these tests need no libtpu. The small programs check values (their
times are mostly the latencies of four kernels); a ResNet-sized one, stored without data, checks time.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import tpusim
from tpusim.compiler.hlo import parse_module

DATA = Path(__file__).parent / "data" / "xla_conv_layouts"
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}
PROGRAMS = ("conv3x3_bf16", "conv3x3_stride2_bf16")


@pytest.mark.parametrize("chip", sorted(CHIPS))
@pytest.mark.parametrize("name", PROGRAMS)
def test_xlas_batch_in_sublanes_convolutions_give_jaxs_answer(name: str, chip: str) -> None:
    """JAX's exact outputs with no fallback (3x3, SAME, strides 1 and 2)."""
    module = parse_module(gzip.decompress((DATA / name / f"{chip}.hlo.gz").read_bytes()).decode())
    entry = module.entry_computation
    with np.load(DATA / name / "data.npz") as data:
        inputs = [data[f"in{i}"].astype(p.array_shape.element_type.dtype) for i, p in enumerate(entry.parameters)]
        want = data["out0"]
    result = tpusim.simulate(module, inputs, config=CHIPS[chip])
    assert result.fallbacks == ()
    np.testing.assert_array_equal(np.asarray(result.outputs[0]).astype(np.float32), want)


def test_a_resnet_sized_convolution_from_xlas_module_takes_about_what_xla_estimates() -> None:
    """The 3x3 convolution of bf16[8,56,56,64] from XLA's v5e module, timing-only: within issue 15's band
    (0.67x-1.5x) of XLA's own estimate for the module (a model, not a measurement; 29.8x it before)."""
    folder = DATA / "timing" / "conv3x3_56x56_bf16"
    module = parse_module(gzip.decompress((folder / "v5e.hlo.gz").read_bytes()).decode())
    result = tpusim.simulate(module, config="tpu_v5e", timing_only=True)
    assert result.fallbacks == ()
    xla = json.loads((folder / "v5e.json").read_text())["optimal_seconds"]
    assert 0.67 <= result.seconds / xla <= 1.5, f"tpusim {result.seconds * 1e6:.2f} us, XLA {xla * 1e6:.2f} us"
