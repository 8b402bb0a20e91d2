"""tpusim: a cycle-level simulator of a TPU-like accelerator that runs real XLA HLO programs."""

from typing import TYPE_CHECKING

from tpusim.errors import TpusimError
from tpusim.lazy import lazy_attribute

if TYPE_CHECKING:  # for type checkers and editors; at run time these are imported on first use
    from tpusim.api import InputError, SimulationResult, compile_program, simulate, simulate_jax
    from tpusim.compiler.errors import CompileError
    from tpusim.compiler.options import CompileOptions
    from tpusim.compiler.pipeline import CompiledProgram
    from tpusim.config import ChipConfig, load_config
    from tpusim.errors import ConfigError
    from tpusim.limits import RunLimitError

__version__ = "0.1.0"

# The public API: name -> the module that defines it. The simulator pulls in the compiler and the device
# model, so everything but the errors is imported on first use only.
_LAZY = {
    "simulate": "tpusim.api", "simulate_jax": "tpusim.api", "compile_program": "tpusim.api",
    "SimulationResult": "tpusim.api", "InputError": "tpusim.api",
    "CompileOptions": "tpusim.compiler.options", "CompiledProgram": "tpusim.compiler.pipeline",
    "CompileError": "tpusim.compiler.errors", "load_config": "tpusim.config", "ChipConfig": "tpusim.config",
    "ConfigError": "tpusim.errors", "RunLimitError": "tpusim.limits",
}  # fmt: skip

__all__ = [
    "ChipConfig", "CompileError", "CompileOptions", "CompiledProgram", "ConfigError", "InputError", "RunLimitError",
    "SimulationResult", "TpusimError", "__version__", "compile_program", "load_config", "simulate", "simulate_jax",
]  # fmt: skip


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    return lazy_attribute(__name__, _LAZY, name)


def __dir__() -> list[str]:
    return sorted(__all__)
