"""One input layer for every file the CLI reads: stack files, manifests, Pulumi JSON, outputs.

Stdlib plus PyYAML. Every reader here either returns plain Python data (dicts, lists, scalars)
or raises :class:`InputError` with one line that names the file and, where there is one, the
line and column, and says what is valid. Nothing here lets a hostile file run unbounded:

- **size**: at most ``Limits.max_bytes`` are read (``/dev/zero`` is refused after that many);
- **encoding**: UTF-8 only (a UTF-8 BOM is dropped); UTF-16/32 and binary files are refused;
- **nesting depth**: JSON is scanned for depth before it is parsed, YAML is composed with a
  depth counter, so neither reaches Python's recursion limit;
- **YAML aliases**: at most ``max_aliases`` alias uses and ``max_nodes`` nodes once aliases are
  expanded (a "billion laughs" alias bomb is refused while it is read, not when a consumer walks
  it), and no recursive aliases.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULT_LIMITS",
    "InputError",
    "Limits",
    "decode",
    "load_json",
    "load_yaml",
    "load_yaml_documents",
    "parse_json",
    "parse_yaml_documents",
    "read_bytes",
    "read_text",
]

VALID_TEXT = "UTF-8 text"


class InputError(ValueError):
    """A file that cannot be read as what the command expects; the message names the file."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 16 * 1024 * 1024
    """Bytes read from one file (a 100-slice ``pulumi stack export`` is about 1 MB)."""
    max_depth: int = 100
    """Nesting of mappings and lists (a KubeRay object in a Pulumi export is about 20 deep)."""
    max_aliases: int = 1000
    """YAML alias uses (``*name``) in one file."""
    max_nodes: int = 1_000_000
    """YAML nodes once every alias is expanded (what a consumer that walks the data visits)."""


DEFAULT_LIMITS = Limits()

_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _human(size: int) -> str:
    return f"{size // (1024 * 1024)} MiB" if size >= 1024 * 1024 else f"{size} bytes"


def read_bytes(path: Path, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """At most ``limits.max_bytes`` bytes of ``path``; raises :class:`InputError`."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limits.max_bytes + 1)
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    if len(data) > limits.max_bytes:
        raise InputError(
            f"{path}: larger than {_human(limits.max_bytes)}; valid: a file of at most "
            f"{_human(limits.max_bytes)}"
        )
    return data


def _line_column(data: bytes | str, offset: int) -> tuple[int, int]:
    before = data[:offset]
    newline = b"\n" if isinstance(before, bytes) else "\n"
    line = before.count(newline) + 1  # type: ignore[arg-type]
    column = offset - (before.rfind(newline) + 1)  # type: ignore[arg-type]
    return line, column + 1


def decode(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text (a UTF-8 BOM dropped); raises :class:`InputError` for the rest."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise InputError(
                f"{source}: is {name} encoded; valid: {VALID_TEXT} "
                f"(convert it: iconv -f {name} -t UTF-8)"
            )
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    nul = data.find(b"\0")
    if nul >= 0:
        line, column = _line_column(data, nul)
        raise InputError(
            f"{source}: line {line}, column {column}: a NUL byte (a binary or UTF-16 file); "
            f"valid: {VALID_TEXT}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line, column = _line_column(data, error.start)
        raise InputError(
            f"{source}: line {line}, column {column}: byte {data[error.start]:#04x} is not "
            f"UTF-8; valid: {VALID_TEXT}"
        ) from None


def read_text(path: Path, limits: Limits = DEFAULT_LIMITS) -> str:
    """The text of ``path``, size-limited and decoded as UTF-8; raises :class:`InputError`."""
    return decode(read_bytes(path, limits), str(path))


# ----------------------------------------------------------------------------------- JSON
# Strings (with their escapes) or one bracket: brackets inside strings do not count.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _json_depth_check(text: str, source: str, max_depth: int) -> None:
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > max_depth:
                line, column = _line_column(text, token.start())
                raise InputError(
                    f"{source}: line {line}, column {column}: nested deeper than {max_depth} "
                    f"levels; valid: at most {max_depth} levels of objects and arrays"
                )
        elif char in "]}":
            depth -= 1


def parse_json(text: str, source: str, limits: Limits = DEFAULT_LIMITS) -> Any:
    """One JSON document; raises :class:`InputError` with line and column."""
    _json_depth_check(text, source, limits.max_depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{source}: line {error.lineno}, column {error.colno}: not valid JSON: {error.msg}"
        ) from None
    except (ValueError, RecursionError) as error:  # e.g. an integer of > 4300 digits
        raise InputError(f"{source}: not valid JSON: {error}") from None


def load_json(path: Path, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Read and parse one JSON file; raises :class:`InputError`."""
    return parse_json(read_text(path, limits), str(path), limits)


# ----------------------------------------------------------------------------------- YAML
class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts depth and aliases (pure Python, so it can count)."""

    limits: Limits = DEFAULT_LIMITS
    source = ""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def _refuse(self, mark: Any, problem: str) -> None:
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InputError(f"{self.source}: {where}{problem}")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self.limits.max_aliases:
                mark = self.peek_event().start_mark
                self._refuse(
                    mark,
                    f"more than {self.limits.max_aliases} YAML aliases; valid: at most "
                    f"{self.limits.max_aliases} (write the values out, or use fewer anchors)",
                )
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self.limits.max_depth:
                self._refuse(
                    self.peek_event().start_mark,
                    f"nested deeper than {self.limits.max_depth} levels; valid: at most "
                    f"{self.limits.max_depth} levels of mappings and lists",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: yaml.Node, source: str, limits: Limits) -> None:
    """Refuse a document whose alias-expanded node count exceeds ``limits.max_nodes``."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            mark = node.start_mark
            raise InputError(
                f"{source}: line {mark.line + 1}, column {mark.column + 1}: a recursive YAML "
                "alias (a node that contains itself); valid: aliases to finished nodes only"
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        if total > limits.max_nodes:
            mark = node.start_mark
            raise InputError(
                f"{source}: line {mark.line + 1}, column {mark.column + 1}: YAML aliases expand "
                f"to more than {limits.max_nodes} values (an alias bomb?); valid: at most "
                f"{limits.max_nodes}"
            )
        sizes[key] = total
        return total

    size(root)


def parse_yaml_documents(text: str, source: str, limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """Every document of a YAML stream, as plain data; raises :class:`InputError`."""
    loader_class = type("Loader", (_LimitedLoader,), {"limits": limits, "source": source})
    loader = None
    documents: list[Any] = []
    try:
        loader = loader_class(text)  # its reader refuses non-printable characters here
        while loader.check_node():
            node = loader.get_node()
            _expanded_size(node, source, limits)
            documents.append(loader.construct_document(node))
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = error.problem or error.context or "syntax error"
        raise InputError(f"{source}: {where}not valid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise InputError(f"{source}: not valid YAML: {error}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        # The safe constructors raise these for values they cannot build (a timestamp
        # 2024-13-45, an integer of > 4300 digits).
        if isinstance(error, InputError):
            raise
        raise InputError(f"{source}: not valid YAML: {error}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return documents


def load_yaml_documents(path: Path, limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """Read every document of a YAML file; raises :class:`InputError`."""
    return parse_yaml_documents(read_text(path, limits), str(path), limits)


def load_yaml(path: Path, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Read a single-document YAML file (None when empty); raises :class:`InputError`."""
    documents = load_yaml_documents(path, limits)
    if len(documents) > 1:
        raise InputError(
            f"{path}: holds {len(documents)} YAML documents; valid: one document (no '---')"
        )
    return documents[0] if documents else None
