"""YAML that remembers where things are: the one loader for config and rule files.

``parse_yaml`` reads one document with a SafeLoader (:class:`LineLoader`) whose mappings
(:class:`LineDict`) and sequences (:class:`LineList`) keep the 1-based line of each key and item.
Duplicate keys do not stop the parse: each becomes an ``Issue`` (the first value is kept), so one
load reports all of them. ``line_index`` flattens those lines to ``{path: line}`` for callers that
locate problems by data path (pydantic error locations); ``dotted`` writes such a path for users.

Bounded input (issue 17): a document is refused, as one ``Issue`` at its file:line, before
anything is built from it, when its text is over :data:`MAX_YAML_BYTES` or when its aliases
would expand it to more than :data:`MAX_YAML_NODES` nodes (a "billion laughs": ten aliases of
ten aliases ... are a few hundred bytes that every later walk, validation or copy expands to
10^9 values) or make it contain itself (a recursive alias). The node count is taken on the
composed node graph, where an alias is the anchored node itself, so checking costs one visit
per distinct node. :func:`read_yaml_text` reads a file with the same byte bound.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import yaml

from ftwatch.errors import Issue

MAX_YAML_BYTES = 8 * 1024 * 1024
"""The longest config or rule file read, in bytes: 40x the biggest shipped pack (ascend.yaml, 216 kB)."""

MAX_YAML_NODES = 200_000
"""The most nodes (scalars, mappings, sequences) a document may hold once its aliases are expanded:
30x the biggest shipped pack (ascend.yaml, 6,900 nodes); validating that many takes well under a second."""

Loc = tuple[Union[str, int], ...]
"""A path into the data: mapping keys and list indices, from the root."""


class LineDict(dict):
    """A mapping read from YAML that remembers where it and each of its keys start (1-based)."""

    line: int = 0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int:
        """Returns the line of ``key``, else the line of the mapping itself."""
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A sequence read from YAML that remembers where it and each item start (1-based)."""

    line: int = 0

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.item_lines: list[int] = []

    def line_of(self, index: int) -> int:
        """Returns the line of item ``index``, else the line of the sequence itself."""
        return self.item_lines[index] if index < len(self.item_lines) else self.line


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML has it (~8x the pure-Python one: 10,000 rules load in seconds,
not tens of seconds); the constructors below are Python either way."""


class LineLoader(_SAFE_LOADER):
    """A SafeLoader whose mappings and sequences keep line numbers and that reports duplicate keys.

    Args:
        stream: the YAML text.
        name: the file name used in issues.
        paths: word issues by data path (``policy.x: duplicate key (first at line 2)``) instead of
            by key (``duplicate key 'x' (first at line 2)``).
        merge_keys: allow ``<<`` merge keys; when False each one is an issue and is skipped.

    Attributes:
        issues: the duplicate-key (and bad-key) issues found so far.
    """

    def __init__(self, stream: str, name: str = "<string>", *, paths: bool = False, merge_keys: bool = True):
        super().__init__(stream)
        self.name, self.paths, self.merge_keys = name, paths, merge_keys
        self.issues: list[Issue] = []
        self.path: list[Any] = []          # where the mapping being constructed sits


def _construct_mapping(loader: LineLoader, node: yaml.MappingNode) -> LineDict:
    if loader.merge_keys:
        loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if key_node.tag == "tag:yaml.org,2002:merge":
            loader.issues.append(Issue(loader.name, line, "merge keys (<<) are not supported"))
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            where = f"{dotted(loader.path)}: " if loader.paths else ""
            loader.issues.append(Issue(loader.name, line, f"{where}a mapping key must be a plain value"))
            continue
        if key in out:
            first = out.key_lines[key]
            message = (f"{dotted([*loader.path, key])}: duplicate key (first at line {first})" if loader.paths
                       else f"duplicate key {key!r} (first at line {first})")
            loader.issues.append(Issue(loader.name, line, message))
            continue
        loader.path.append(key)
        try:
            out[key] = loader.construct_object(value_node, deep=True)
        finally:
            loader.path.pop()
        out.key_lines[key] = line
    return out


def _construct_sequence(loader: LineLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList()
    out.line = node.start_mark.line + 1
    for i, child in enumerate(node.value):
        loader.path.append(i)
        try:
            out.append(loader.construct_object(child, deep=True))
        finally:
            loader.path.pop()
        out.item_lines.append(child.start_mark.line + 1)
    return out


LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def parse_yaml(text: str, name: str, *, paths: bool = False, merge_keys: bool = True) -> tuple[Any, list[Issue]]:
    """Parses one YAML document, keeping line numbers. Never raises for bad YAML.

    Args:
        text: the document.
        name: the file name used in issues.
        paths: word key issues by data path (see :class:`LineLoader`).
        merge_keys: allow ``<<`` merge keys (see :class:`LineLoader`).

    Returns:
        (data, issues): data holds :class:`LineDict`/:class:`LineList` for mappings/sequences and
        is None when the text is empty, does not parse or is over the bounds (module doc);
        issues hold the syntax error (at the line YAML names, message starting with ``YAML``)
        or the bound passed, and every duplicate key.
    """
    if len(text) > MAX_YAML_BYTES:
        line = text.count("\n", 0, MAX_YAML_BYTES) + 1
        return None, [Issue(name, line, f"YAML file too large: over {MAX_YAML_BYTES:,} characters")]
    loader = LineLoader(text, name, paths=paths, merge_keys=merge_keys)
    try:
        node = loader.get_single_node()
        # no "&", no anchor, so no alias (one to an undefined anchor is a syntax error) and nothing
        # to expand: the walk over every node (~0.4 s of a 10,000-rule file) is skipped
        bomb = _expansion_issue(node, name) if node is not None and "&" in text else None
        if bomb is not None:
            return None, loader.issues + [bomb]
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        return None, loader.issues + [Issue(name, line, f"YAML syntax error: {what}")]
    except yaml.YAMLError as exc:
        return None, loader.issues + [Issue(name, 0, f"YAML error: {exc}")]
    except RecursionError:
        return None, loader.issues + [Issue(name, 0, "YAML error: structure too deep (recursive alias?)")]
    finally:
        loader.dispose()
    return data, loader.issues


def read_yaml_text(path: Any) -> str:
    """Reads a config or rule file as UTF-8, refusing one over :data:`MAX_YAML_BYTES` unread.

    Raises:
        OSError: it cannot be read, or is too large (the message says so).
        UnicodeDecodeError: it is not UTF-8.
    """
    with open(path, "rb") as f:
        raw = f.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise OSError(f"file too large: over {MAX_YAML_BYTES:,} bytes")
    return raw.decode("utf-8")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expansion_issue(root: yaml.Node, name: str, limit: int = MAX_YAML_NODES) -> Issue | None:
    """The Issue of a node graph whose aliases expand past ``limit`` nodes or into a cycle, else None.

    Sizes are summed bottom-up with one visit per distinct node (an alias is its anchored node,
    shared), iteratively (no recursion limit); the Issue names the line of the first collection
    found to be over the limit.
    """
    size: dict[int, int] = {}
    open_: set[int] = set()           # the collections whose children are being counted
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, counted = stack.pop()
        key = id(node)
        if counted:
            open_.discard(key)
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > limit:
                return Issue(name, node.start_mark.line + 1,
                             f"YAML aliases expand this to more than {limit:,} nodes (a \"billion laughs\"?); "
                             "write the values out instead")
            size[key] = total
            continue
        if key in size:
            continue
        if key in open_:
            return Issue(name, node.start_mark.line + 1, "YAML alias refers to a node that contains it "
                         "(a recursive structure); write the values out instead")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return None


def line_index(data: Any) -> dict[Loc, int]:
    """Flattens the lines kept by :func:`parse_yaml` to a table.

    Args:
        data: what :func:`parse_yaml` returned.

    Returns:
        {path: line of its key (mappings) or item (sequences)}; the root ``()`` is line 1.
    """
    lines: dict[Loc, int] = {(): 1}
    todo: list[tuple[Loc, Any]] = [((), data)]
    while todo:
        path, node = todo.pop()
        if isinstance(node, LineDict):
            for key, value in node.items():
                lines[path + (key,)] = node.line_of(key)
                todo.append((path + (key,), value))
        elif isinstance(node, LineList):
            for i, value in enumerate(node):
                lines[path + (i,)] = node.line_of(i)
                todo.append((path + (i,), value))
    return lines


def dotted(loc: Sequence[Any]) -> str:
    """Returns a data path as users write it: ``alerting.receivers[0].url`` (``<root>`` for ())."""
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[") or "<root>"
