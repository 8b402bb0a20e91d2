"""Test-wide setup.

JAX is the oracle for numerics. Collective tests need several devices, so the host CPU platform is
split into 8 devices before anything imports jax (the flag is read once, at jax's first import).
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Every program the tests compile is checked by the program verifier (tpusim/compiler/verify.py).
os.environ.setdefault("TPUSIM_VERIFY", "1")
