"""The HLO front end: parse XLA's HLO text into frozen IR values, print it back, verify it.

Public API::

    parse_module(text, source=None, *, verify=True) -> Module
    load_module(path, *, verify=True) -> Module
    print_module(module) -> str
    verify_module(module) -> None
    HloParseError, HloVerifyError

Attribute keys and the Python types of their values are listed in docs/hlo.md. The numpy oracle that
evaluates a module is :mod:`tpusim.compiler.hlo.reference` (imported on its own: parsing loads none of it).
"""

from tpusim.compiler.hlo.errors import HloParseError, HloVerifyError
from tpusim.compiler.hlo.parser import load_module, parse_module
from tpusim.compiler.hlo.printer import print_module
from tpusim.compiler.hlo.verifier import verify_module

__all__ = [
    "HloParseError",
    "HloVerifyError",
    "load_module",
    "parse_module",
    "print_module",
    "verify_module",
]
