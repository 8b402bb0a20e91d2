"""Names a package exports but imports on first use (PEP 562 module ``__getattr__``), so that importing the
package, or one light submodule of it, does not load everything it can offer."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_attribute"]


def lazy_attribute(package: str, where: Mapping[str, str], name: str, submodules: bool = False) -> Any:
    """Attribute ``name`` of ``package``: imported from module ``where[name]`` (a dotted path); with
    ``submodules``, also a submodule of ``package`` by that name (as an eager import of it would have set).

    Raises:
        AttributeError: ``package`` offers no such name.
    """
    if name in where:
        return getattr(importlib.import_module(where[name]), name)
    if submodules and importlib.util.find_spec(f"{package}.{name}") is not None:
        return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
