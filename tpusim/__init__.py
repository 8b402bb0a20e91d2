"""tpusim: a cycle-level simulator of a TPU-like accelerator that runs real XLA HLO programs."""

from tpusim.errors import TpusimError

__version__ = "0.1.0"

__all__ = ["TpusimError", "__version__"]
