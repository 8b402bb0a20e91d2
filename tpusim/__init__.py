"""tpusim: a cycle-level simulator of a TPU-like accelerator that runs real XLA HLO programs."""

from tpusim.errors import TpusimError

__version__ = "0.1.0"

__all__ = ["SimulationResult", "TpusimError", "__version__", "compile_program", "simulate", "simulate_jax"]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # The simulator pulls in the compiler and the device model; import them on first use only.
    if name in ("compile_program", "simulate", "simulate_jax", "SimulationResult"):
        from tpusim import api

        return getattr(api, name)
    raise AttributeError(f"module 'tpusim' has no attribute {name!r}")
