"""Check a document against :data:`tpusim.report.schema.SUMMARY_SCHEMA` without a JSON Schema library.

The summary's schema uses a small part of JSON Schema (``type``, ``enum``, ``const``, ``minimum``,
``exclusiveMinimum``, ``maximum``, ``oneOf``, ``properties``, ``required``, ``additionalProperties``,
``items``, ``minItems``); :func:`first_problem` implements
exactly that part, so ``tpusim report`` can refuse an edited or damaged ``summary.json`` by the path of its
first bad value instead of failing somewhere in the plots (jsonschema is a test dependency, not a runtime
one; the tests check that both agree).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["first_problem"]

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
}


def first_problem(value: Any, schema: dict[str, Any], path: str = "") -> str | None:
    """The first way ``value`` breaks ``schema``, as ``"path: what"`` (path like ``totals.cycles`` or
    ``units[3].name``), or None when it follows it."""
    at = path or "(the document)"
    if "oneOf" in schema:
        fits = [first_problem(value, s, path) is None for s in schema["oneOf"]]
        if fits.count(True) != 1:
            return f"{at}: {_show(value)} matches {fits.count(True)} of the {len(fits)} allowed forms, not one"
    if "const" in schema and value != schema["const"]:
        return f"{at}: must be {schema['const']!r}, not {_show(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{at}: must be one of {', '.join(map(repr, schema['enum']))}, not {_show(value)}"
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[k](value) for k in kinds):
            return f"{at}: must be {' or '.join(kinds)}, not {_show(value)}"
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{at}: must be at least {schema['minimum']}, not {_show(value)}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"{at}: must be more than {schema['exclusiveMinimum']}, not {_show(value)}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{at}: must be at most {schema['maximum']}, not {_show(value)}"
    if isinstance(value, list) and len(value) < schema.get("minItems", 0):
        return f"{at}: must hold at least {schema['minItems']} items, not {len(value)}"
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                return f"{at}: the key {key!r} is missing"
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            problem = first_problem(item, sub, f"{path}.{key}" if path else str(key)) if sub else None
            if problem:
                return problem
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = first_problem(item, schema["items"], f"{path}[{i}]")
            if problem:
                return problem
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
