"""Test-wide setup.

JAX is the oracle for numerics. Collective tests need several devices, so the host CPU platform is
split into 8 devices before anything imports jax (the flag is read once, at jax's first import).

A test module's random generator ``RNG`` is reseeded before each of its tests from the test's name, so a
test draws the same inputs whichever tests ran before it (a subset with -k, another order, xdist workers).
"""

import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Every program the tests compile is checked by the program verifier (tpusim/compiler/verify.py).
os.environ.setdefault("TPUSIM_VERIFY", "1")


@pytest.fixture(autouse=True)
def _per_test_rng(request: pytest.FixtureRequest) -> None:
    module = request.module
    if isinstance(getattr(module, "RNG", None), np.random.Generator):
        module.RNG = np.random.default_rng(zlib.crc32(f"{module.__name__}::{request.node.name}".encode()))
