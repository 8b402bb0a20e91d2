"""YAML reading for every file tpusim takes (chip configs, tiling rule sets, sweep specs): plain data only, and
errors that name the file, line, column and key.

Mappings load as :class:`YamlMap` (a dict with the line of the mapping and of each key); a key written
twice is an error rather than silently keeping the last value. ``1.5e9`` is a number, ``010`` is ten and
``off`` is text, as in YAML 1.2 (PyYAML alone, following YAML 1.1, reads the first as text, the second as
octal 8 and the third as false; ``0o10`` is octal, ``true`` and ``false`` the booleans).

Only plain data is accepted: mappings, lists, strings, numbers, booleans and null. Everything else is a
:class:`YamlError` (a :class:`~tpusim.errors.ConfigError`) naming ``file:line:column`` and the key:

* tags other than the standard ones of those types (``!!python/name:os.system``, ``!foo``, ``!!binary``);
  a safe loader could not build them anyway, and tpusim's files never need them;
* aliases (``*name``) and merge keys (``<<``): an alias shares one value between two places, which an
  override of one of them would silently change in both, and nested aliases expand exponentially (a few
  lines can stand for billions of values); write the values out instead;
* a standard tag whose text is not of its type (``!!int abc``), and integers too long for Python to read
  (over 4,300 digits);
* nesting deeper than :data:`MAX_DEPTH` levels, and text that is not UTF-8.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from tpusim.errors import ConfigError
from tpusim.paths import regular_file_problem

__all__ = [
    "MAX_DEPTH",
    "SafeLoader",
    "YamlError",
    "YamlMap",
    "compose_yaml",
    "load_yaml",
    "read_text",
    "scalar_value",
    "shorten",
    "show_value",
    "where",
]

MAX_DEPTH = 64
"""Deepest nesting of lists and mappings accepted (tpusim's files nest four levels at most; PyYAML's
composer recurses once per level and would otherwise fail with Python's recursion limit)."""

_STD = "tag:yaml.org,2002:"
SAFE_TAGS = frozenset(_STD + t for t in ("str", "int", "float", "bool", "null", "map", "seq"))
"""The tags a tpusim YAML file may carry (written out, as in ``!!int 3``, or implied by the text)."""

_QUOTE = 80


def shorten(text: str, limit: int = _QUOTE) -> str:
    """``text`` for an error message: cut to about ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - 24, 8)]}... ({len(text):,} characters)"


def show_value(value: Any) -> str:
    """A value for an error message: repr, with long text cut and huge integers described by their size."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() <= 64:
            return str(value)
        digits = math.floor((value.bit_length() - 1) * math.log10(2)) + 1
        return f"an integer of {digits:,} digits"
    if isinstance(value, str):
        return repr(shorten(value))
    return shorten(repr(value))


def _tag_text(tag: str) -> str:
    return "!!" + tag[len(_STD) :] if tag.startswith(_STD) else tag


class YamlError(ConfigError):
    """YAML tpusim does not read: not valid YAML, not plain data, or a scalar that is not of its tag's type.

    Attributes:
        source: the file (or ``<override>``-like label) that was read.
        line, column: 1-based position (0 when unknown).
        key: the dotted key the problem is under (``grid.mxu.rows[1]``), or ``""`` at the top level.
        problem: what is wrong, without the position.
    """

    def __init__(self, source: str, line: int, column: int, key: str, problem: str) -> None:
        self.source, self.line, self.column, self.key, self.problem = source, line, column, key, problem
        at = f"{source}:{line}:{column}" if line else source
        super().__init__(f"{at}: {key}: {problem}" if key else f"{at}: {problem}")


class YamlMap(dict):  # type: ignore[type-arg]
    """A mapping read from YAML; ``line`` is where it starts, ``key_lines[key]`` where each key is."""

    line: int = 0
    key_lines: dict[Any, int]
    source: str = "<yaml>"


def _key_text(parts: list[str]) -> str:
    out = ""
    for p in parts:
        out += p if p.startswith("[") or not out else f".{p}"
    return out


class SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing only plain data (see the module docstring), reading ``1.5e9`` as a
    number, and remembering the dotted key of every node (``paths``) for error messages."""

    def __init__(self, text: str, source: str = "<yaml>") -> None:
        super().__init__(text)
        self.source = source
        self.paths: dict[int, str] = {}  # id(node) -> dotted key
        self._parts: list[str] = []
        self._depth = 0

    def fail(self, mark: Any, key: str, problem: str) -> YamlError:
        key = shorten(key)
        if mark is None:
            return YamlError(self.source, 0, 0, key, problem)
        return YamlError(self.source, mark.line + 1, mark.column + 1, key, problem)

    # -- composing: the checks that need no values
    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        part = None
        if isinstance(parent, yaml.MappingNode) and isinstance(index, yaml.ScalarNode):
            part = shorten(str(index.value), 40)
        elif isinstance(parent, yaml.SequenceNode) and isinstance(index, int):
            part = f"[{index}]"
        if part is not None:
            self._parts.append(part)
        self._depth += 1
        try:
            key = _key_text(self._parts)
            if self._depth > MAX_DEPTH:
                raise self.fail(event.start_mark, key, f"nested more than {MAX_DEPTH} levels deep")
            if isinstance(event, yaml.AliasEvent):
                raise self.fail(event.start_mark, key, f"aliases (*{shorten(str(event.anchor), 40)}) are not "
                                "supported; write the value out")  # fmt: skip
            tag = getattr(event, "tag", None)
            if tag is not None and tag != "!" and tag not in SAFE_TAGS:
                raise self.fail(event.start_mark, key, f"the tag {shorten(_tag_text(tag), 60)} is not supported "
                                "(only plain mappings, lists, strings, numbers, booleans and null)")  # fmt: skip
            node = super().compose_node(parent, index)
            if isinstance(parent, yaml.MappingNode) and index is None and node.tag == _STD + "merge":
                raise self.fail(node.start_mark, key, "merge keys (<<) are not supported; write the keys out")
            self.paths[id(node)] = key
            return node
        finally:
            self._depth -= 1
            if part is not None:
                self._parts.pop()

    # -- constructing: a scalar whose text is not of its tag's type is the file's fault, not a bug
    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return super().construct_object(node, deep)
        try:
            return super().construct_object(node, deep)
        except (ConfigError, yaml.YAMLError):
            raise
        except Exception as err:  # ValueError, KeyError, AttributeError from PyYAML's scalar constructors
            raise self.fail(node.start_mark, self.paths.get(id(node), ""), _scalar_problem(node, err)) from None


# Numbers and booleans as YAML 1.2's core schema has them. PyYAML follows YAML 1.1, which also read
# `1:20` as 80 (base 60), `0b1000` as 8 and `1_000` as 1000, `010` as octal 8 (so `--set mxu.rows=010` gave 8
# rows), and yes, no, on and off as booleans (`double_buffered: off` was false, `name: no` not text): its
# resolvers for the three are replaced, and those texts stay text (a key that wants a number refuses them).
SafeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_STD + "bool", _STD + "int", _STD + "float")]
    for first, resolvers in SafeLoader.yaml_implicit_resolvers.items()
}
SafeLoader.add_implicit_resolver(
    _STD + "float",
    re.compile(
        r"^[-+]?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?"
        r"|[0-9]+[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
SafeLoader.add_implicit_resolver(
    _STD + "int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
SafeLoader.add_implicit_resolver(_STD + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _construct_int(loader: SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer as YAML 1.2 reads it: decimal (``010`` is ten), ``0o`` octal or ``0x`` hexadecimal."""
    text = str(loader.construct_scalar(node))
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


SafeLoader.add_constructor(_STD + "int", _construct_int)


def _scalar_problem(node: yaml.ScalarNode, err: Exception) -> str:
    text = str(node.value)
    kind = _tag_text(node.tag)
    if node.tag == _STD + "int" and "digits" in str(err):  # Python's limit on int(str): 4,300 digits
        digits = sum(c.isdigit() for c in text)
        return f"an integer of {digits:,} digits is too long to read (at most {sys.get_int_max_str_digits():,})"
    return f"{shorten(text)!r} is not a valid {kind} value"


def _construct_mapping(loader: SafeLoader, node: yaml.MappingNode) -> YamlMap:
    out = YamlMap()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    out.source = loader.source
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise loader.fail(key_node.start_mark, loader.paths.get(id(node), ""), "keys must be text or numbers, "
                              "not lists or mappings") from None  # fmt: skip
        if key in out:
            raise ConfigError(
                f"{loader.source}:{line}: key '{shorten(str(key), 60)}' is given twice (first on line "
                f"{out.key_lines[key]})"
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = line
    return out


SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of ``path`` as UTF-8, or a ConfigError naming the file (and where the first bad byte is)."""
    problem = regular_file_problem(path)
    if problem:
        raise ConfigError(f"{path}: cannot read {what}: it {problem}")
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read {what}: {err.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ConfigError(f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[err.start]:02x})") from None


def _syntax_error(source: str, text: str, err: yaml.YAMLError) -> YamlError:
    mark = getattr(err, "problem_mark", None)
    problem = f"not valid YAML: {shorten(str(getattr(err, 'problem', None) or str(err).splitlines()[0]), 200)}"
    if mark is not None:
        return YamlError(source, mark.line + 1, mark.column + 1, "", problem)
    if isinstance(err, yaml.reader.ReaderError):  # a character YAML does not allow: a position, no mark
        pos = min(err.position, len(text))
        return YamlError(source, text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1, "", problem)
    return YamlError(source, 0, 0, "", problem)


def compose_yaml(text: str, source: str = "<yaml>") -> tuple[yaml.Node | None, SafeLoader]:
    """Parse ``text`` into a node tree (None for an empty document), checked as the module docstring says.

    Returns the loader too: :func:`scalar_value` builds values of the nodes with it.
    """
    try:
        loader = SafeLoader(text, source)
        return loader.get_single_node(), loader
    except yaml.YAMLError as err:
        raise _syntax_error(source, text, err) from None
    except RecursionError:
        raise YamlError(source, 0, 0, "", f"nested more than {MAX_DEPTH} levels deep") from None


def scalar_value(loader: SafeLoader, node: yaml.Node) -> Any:
    """The Python value of a node composed by ``loader`` (see :func:`compose_yaml`); errors name its place."""
    return loader.construct_object(node, deep=True)


def load_yaml(path: str | Path, text: str | None = None) -> Any:
    """Read a YAML file (or ``text``, reported as coming from ``path``) with line-annotated mappings."""
    source = str(path)
    if text is None:
        text = read_text(path)
    node, loader = compose_yaml(text, source)
    try:
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def where(mapping: Any, key: Any = None) -> str:
    """``file:line`` of ``key`` in a mapping read by :func:`load_yaml` (or of the mapping itself)."""
    if not isinstance(mapping, YamlMap):
        return "<yaml>"
    line = mapping.key_lines.get(key, mapping.line) if key is not None else mapping.line
    return f"{mapping.source}:{line}"
