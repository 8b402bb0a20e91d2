"""YAML reading that remembers where every key was written, for errors that name file, line and key.

Mappings load as :class:`YamlMap` (a dict with the line of the mapping and of each key); a key written
twice is an error rather than silently keeping the last value. Only YAML's safe subset is accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tpusim.errors import ConfigError

__all__ = ["YamlMap", "load_yaml", "where"]


class YamlMap(dict):  # type: ignore[type-arg]
    """A mapping read from YAML; ``line`` is where it starts, ``key_lines[key]`` where each key is."""

    line: int = 0
    key_lines: dict[Any, int]
    source: str = "<yaml>"


class _Loader(yaml.SafeLoader):
    source = "<yaml>"


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> YamlMap:
    loader.flatten_mapping(node)
    out = YamlMap()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    out.source = loader.source
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in out:
            raise ConfigError(
                f"{loader.source}:{line}: key '{key}' is given twice (first on line {out.key_lines[key]})"
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = line
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path, text: str | None = None) -> Any:
    """Read a YAML file (or ``text``, reported as coming from ``path``) with line-annotated mappings."""
    source = str(path)
    if text is None:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ConfigError(f"{source}: cannot read: {err.strerror}") from None
    loader = _Loader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        line = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: not valid YAML: {err.problem}") from None
    finally:
        loader.dispose()


def where(mapping: Any, key: Any = None) -> str:
    """``file:line`` of ``key`` in a mapping read by :func:`load_yaml` (or of the mapping itself)."""
    if not isinstance(mapping, YamlMap):
        return "<yaml>"
    line = mapping.key_lines.get(key, mapping.line) if key is not None else mapping.line
    return f"{mapping.source}:{line}"
