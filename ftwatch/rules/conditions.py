"""Rule conditions (SPEC P4): a ``when:`` AST -> the matcher's prefilter + a per-hit predicate.

``ftwatch.parsers.grammars.conditions`` parses the text once, at load time; this module checks
fields and values against what ftwatch knows (levels, signals, the fault tables) and compiles the
AST into two parts:

* the **prefilter**: the condition's positive ``keyword``/``regex`` terms, which join the engine's
  one multi-pattern database like any rule pattern. A line that none of them hits is never seen
  by Python (DESIGN.md "Speed on the hot path").
* the **predicate**: plain Python closures (RE2 for text terms, the line-field extractors for
  fields) called only on lines the prefilter hit, ``predicate(raw_line, origin) -> bool``.

Semantics (documented for rule authors in the README, "Conditions"):

* A condition is about ONE line (patterns never span lines). In a multi-line record (a
  traceback) the rule fires when one of its lines both hits the prefilter and passes the predicate.
* ``keyword``/``regex`` terms match the raw line exactly as rule patterns do (rank prefix kept,
  ANSI removed, byte-wise, the rule's ``caseless``), on both matcher backends alike.
* ``not`` terms never enter the prefilter: ``not keyword "x"`` cannot say which lines to look at.
  The prefilter of ``a and b`` is a's (else b's), of ``a or b`` both (each side needs one);
  ``not`` is pushed inward (``not (a or b)`` is ``not a and not b``). A rule with ``keywords:`` or
  ``regex:`` keeps them as its prefilter and its ``when`` is ANDed with them; a rule with only
  ``when:`` whose condition gives no prefilter (fields, levels, ``not`` terms alone) is rejected
  at load: it would need Python on every line.
* A comparison on a field the line does not carry is false, whatever the operator (``xid != 79``
  is false on a line without an Xid; write ``not xid == 79`` for "anything but"). A field with
  several values on a line (two fault codes) compares true when any value does.

Fields (values are checked at load):

=====================  ===================================================  ==============
field                  what                                                  operators
=====================  ===================================================  ==============
level                  DEBUG < INFO < WARNING (WARN) < ERROR < CRITICAL      all, ``in``
                       (FATAL), from ``ftwatch.parsers.fields.level_of``
rank                   the line's rank prefix, else the origin's rank        all, ``in``
node                   the origin's host name                                ``== != in``
exit_code, signal      from the line (``ftwatch.parsers.linefacts``);        all / ``== != in``
                       signals by name (SIGKILL) or number
nccl_op                ``OpType=ALLREDUCE`` / ``AllReduce: opCount``         ``== != in``
xid, fault_code, dcgm  the codes ``FaultTables.extract`` finds on the line   xid: all; ``in``
<kind>.action          the table's graded action (none < notify < ... <      all
                       fail_job), kind one of xid, fault_code, dcgm
<kind>.class           the graded failure class                              ``== != in``
fault_code.level       MindCluster level: NotHandleFault = SubHealthFault    all
                       (L1) < RestartRequest (L2) < RestartBusiness (L3) <
                       FreeRestartNPU (L4) < RestartNPU (L5) < PreSeparate*
                       < SeparateNPU (L6) = the other Separate levels;
                       ``L1`` .. ``L6`` also accepted
xid.level              NVIDIA's immediate action (RESET_GPU, RESTART_APP..)  ``== != in``
=====================  ===================================================  ==============

Fault-table fields read the built-in tables (``FaultTables.load()``, once per process), graded
as the engine grades them (an unknown NPU code by its driver severity).

Named groups for ``in``: ``xid in fatal | nonfatal | app_error | known``
(``ftwatch.rules.faultcodes.xid_groups``), ``fault_code in user_input | network | known``
(``USER_INPUT_CODES``, ``NETWORK_CODES``), ``dcgm in known``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.parsers import fields as line_fields
from ftwatch.parsers import linefacts
from ftwatch.parsers.grammars.conditions import (And, Compare, ConditionSyntaxError, Expr, Not, Or, Text,
                                                 parse_condition)
from ftwatch.rules import faultcodes
from ftwatch.rules.model import Pattern
from ftwatch.rules.patterns import _BadPattern, _re2_compile, _re2_options, _translate

__all__ = ["Condition", "ConditionError", "compile_condition", "compile_parsed", "FIELDS"]

Predicate = Callable[[bytes, Origin], bool]
_Test = Callable[["_Facts"], bool]

LEVELS: dict[str, int] = {"DEBUG": 10, "INFO": 20, "WARN": 30, "WARNING": 30, "ERROR": 40, "FATAL": 50,
                          "CRITICAL": 50}
NPU_LEVEL_RANK: dict[str, float] = {
    "NotHandleFault": 1, "SubHealthFault": 1, "RestartRequest": 2, "RestartBusiness": 3,
    "FreeRestartNPU": 4, "RestartNPU": 5, "PreSeparateNPU": 5.5, "PreSeparateFault": 5.5,
    "SeparateNPU": 6, "ManuallySeparateNPU": 6, "SeparateFault": 6, "SeparateDPU": 6,
    "RestartRequestFault": 6, "ResetFault": 6,
}
"""MindCluster's fault levels in order (L1..L6; the pre-separate levels sit between L5 and L6:
they isolate the chip once the job has left it). Ascend/mind-cluster@22bb3d987b faultCode.json."""
_KINDS = {"xid": "xid", "fault_code": "npu", "dcgm": "dcgm"}
FIELDS: tuple[str, ...] = ("level", "rank", "node", "exit_code", "signal", "nccl_op", "xid", "fault_code",
                           "dcgm", "xid.action", "xid.class", "xid.level", "fault_code.action",
                           "fault_code.class", "fault_code.level", "dcgm.action", "dcgm.class")
_ORDERED = frozenset({"<", "<=", ">", ">="})


class ConditionError(ValueError):
    """A condition that does not parse or asks for something ftwatch does not know."""


@dataclass(frozen=True, slots=True)
class Condition:
    """A compiled ``when:`` condition.

    Attributes:
        text: the condition as written.
        expr: its AST.
        prefilter: the patterns that must hit a line before the predicate runs, or None when the
            condition has no positive text term (usable only beside ``keywords``/``regex``).
        predicate: ``predicate(raw_line, origin)``: True when the line satisfies the condition;
            ``raw_line`` is the line's bytes as the matcher scanned them.
    """

    text: str
    expr: Expr
    prefilter: tuple[Pattern, ...] | None
    predicate: Predicate


def compile_condition(text: str, caseless: bool = False) -> Condition:
    """Parses and compiles one condition (at load time).

    Args:
        text: the ``when:`` text.
        caseless: the rule's ``caseless``: applies to the condition's keyword and regex terms.

    Returns:
        The compiled condition.

    Raises:
        ConditionError: a syntax error (with its column), an unknown field, group or value, an
            operator the field does not support, or a text term outside the shared subset or
            that RE2 cannot compile. (Hyperscan's side of a ``prefilter`` term is the rule
            loader's to check, with the rest of its file's patterns.)
    """
    try:
        expr = parse_condition(text)
    except ConditionSyntaxError as exc:
        raise ConditionError(str(exc)) from None
    return compile_parsed(text, expr, caseless)


def compile_parsed(text: str, expr: Expr, caseless: bool = False) -> Condition:
    """:func:`compile_condition` of a condition parsed before (``expr``: its AST, as the rule cache
    keeps it, ``ftwatch.rules.rulecache``). Raises ConditionError as :func:`compile_condition`
    does for everything but syntax."""
    test = _compile(expr, caseless)
    required = _required(expr, True)
    prefilter = None if required is None else tuple(
        dict.fromkeys(Pattern(t.value, regex=t.kind == "regex", caseless=caseless) for t in required))

    return Condition(text, expr, prefilter, LinePredicate(test, _texts_only(expr)))


class LinePredicate:
    """A compiled condition as ``predicate(raw_line, origin) -> bool``.

    Attributes:
        texts_only: the condition has only keyword and regex terms, so its answer is a function
            of the raw line alone (not of the origin, a field or a table): ``ftwatch.rules.judge``
            may remember a record's finding by its raw lines.
    """

    __slots__ = ("_test", "texts_only")

    def __init__(self, test: _Test, texts_only: bool):
        self._test = test
        self.texts_only = texts_only

    def __call__(self, raw: bytes, origin: Origin) -> bool:
        return self._test(_Facts(raw, origin))


def _texts_only(expr: Expr) -> bool:
    """Whether ``expr`` holds keyword and regex terms only (no field comparison)."""
    if isinstance(expr, Text):
        return True
    if isinstance(expr, Not):
        return _texts_only(expr.operand)
    if isinstance(expr, (And, Or)):
        return all(_texts_only(e) for e in expr.operands)
    return False


# -- the prefilter ---------------------------------------------------------------------------

def _required(expr: Expr, positive: bool) -> list[Text] | None:
    """Text terms of which one must match whenever ``expr`` (or ``not expr``) holds, or None."""
    if isinstance(expr, Text):
        return [expr] if positive else None
    if isinstance(expr, Compare):
        return None
    if isinstance(expr, Not):
        return _required(expr.operand, not positive)
    conjunction = isinstance(expr, And) == positive      # De Morgan under a "not"
    parts = [_required(e, positive) for e in expr.operands]
    if conjunction:
        return next((p for p in parts if p is not None), None)
    if any(p is None for p in parts):
        return None
    return [t for p in parts for t in p]


# -- the predicate ---------------------------------------------------------------------------

_UNSET = object()


class _Facts:
    """One hit line's fields, each computed on first use (most conditions ask one or two)."""

    __slots__ = ("raw", "origin", "_cache")

    def __init__(self, raw: bytes, origin: Origin):
        self.raw, self.origin, self._cache = raw, origin, {}

    def get(self, name: str) -> Any:
        value = self._cache.get(name, _UNSET)
        if value is _UNSET:
            value = self._cache[name] = getattr(self, "_" + name)()
        return value

    def _text(self) -> str:
        return line_fields.clean(self.raw)

    def _split(self) -> tuple[int | None, str]:
        return line_fields.split_rank_prefix(self.get("text"))

    def _rank(self) -> list[int]:
        rank = self.get("split")[0]
        rank = self.origin.rank if rank is None else rank
        return [] if rank is None else [rank]

    def _node(self) -> list[str]:
        return [self.origin.node]

    def _level(self) -> list[int]:
        level = line_fields.level_of(self.get("text"))
        return [] if level is None else [LEVELS[level]]

    def _exit_code(self) -> list[int]:
        code = linefacts.exit_code_of(self.get("split")[1])
        return [] if code is None else [code]

    def _signal(self) -> list[int]:
        number = linefacts.signal_of(self.get("split")[1])
        return [] if number is None else [number]

    def _nccl_op(self) -> list[str]:
        op = linefacts.nccl_op_of(self.get("split")[1])
        return [] if op is None else [op]

    def _hits(self) -> list[tuple[str, str, Any]]:
        tables = _tables()
        out = []
        for hit in tables.extract(self.get("split")[1]):
            out.append((hit.kind, hit.code, hit.entry or tables.grade_unknown(hit)))
        return out


@functools.lru_cache(maxsize=1)
def _tables() -> faultcodes.FaultTables:
    return faultcodes.FaultTables.load()


@functools.lru_cache(maxsize=1)
def _groups() -> dict[str, dict[str, frozenset]]:
    xid = faultcodes.xid_groups()
    tables = _tables()
    return {
        "xid": {name: frozenset(str(n) for n in values) for name, values in xid.items()},
        "fault_code": {"user_input": faultcodes.USER_INPUT_CODES, "network": faultcodes.NETWORK_CODES,
                       "known": frozenset(tables._npu)},
        "dcgm": {"known": frozenset(tables._dcgm)},
    }


def _compile(expr: Expr, caseless: bool) -> _Test:
    if isinstance(expr, Text):
        # The predicate runs on RE2 alone: a term is checked there (the shared subset, RE2's
        # compile) and not on Hyperscan, which only a prefilter term meets, in the engine's
        # database; the rule loader checks those with the file's patterns (one compile for the
        # file, not one per term: 131 conditions' regexes took ~2.6 s, on every start, since a
        # cached rule file compiles its conditions again, ``ftwatch.rules.rulecache``)
        pattern = Pattern(expr.value, regex=expr.kind == "regex", caseless=caseless)
        if not expr.value.strip():
            raise ConditionError(f"{expr.kind} {expr.value!r}: empty pattern")
        try:
            search = _re2_compile(_translate(pattern), _re2_options()).search
        except _BadPattern as exc:
            raise ConditionError(f"{expr.kind} {expr.value!r}: {exc}") from None
        return lambda f: search(f.raw) is not None
    if isinstance(expr, Not):
        inner = _compile(expr.operand, caseless)
        return lambda f: not inner(f)
    if isinstance(expr, And):
        parts = tuple(_compile(e, caseless) for e in expr.operands)
        return lambda f: all(p(f) for p in parts)
    if isinstance(expr, Or):
        parts = tuple(_compile(e, caseless) for e in expr.operands)
        return lambda f: any(p(f) for p in parts)
    return _compare(expr)


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def _level(value: str) -> int:
    if value.upper() not in LEVELS:
        raise ValueError(f"{value!r} is not a level ({', '.join(LEVELS)})")
    return LEVELS[value.upper()]


def _signal(value: str) -> int:
    number = linefacts.signal_number(value)
    if number is None:
        raise ValueError(f"{value!r} is not a signal (SIGKILL, KILL or 9)")
    return number


def _action(value: str) -> int:
    return int(Action.parse(value))


def _failure_class(value: str) -> str:
    try:
        return FailureClass(value.lower()).value
    except ValueError:
        raise ValueError(f"{value!r} is not a class ({', '.join(c.value for c in FailureClass)})") from None


def _npu_level(value: str) -> float:
    name = faultcodes.level_name(value)
    if len(name) == 2 and name[0] in "Ll" and name[1] in "123456":
        return float(name[1])
    if name not in NPU_LEVEL_RANK:
        raise ValueError(f"{value!r} is not a MindCluster level ({', '.join(NPU_LEVEL_RANK)}, L1..L6)")
    return NPU_LEVEL_RANK[name]


def _table_values(kind: str, what: str) -> Callable[[_Facts], list]:
    """The values of ``what`` (code, action, class, level) of each ``kind`` code on the line."""
    table_kind = _KINDS[kind]

    def values(f: _Facts) -> list:
        out = []
        for k, code, entry in f.get("hits"):
            if k != table_kind:
                continue
            if what == "code":
                out.append(code)
            elif entry is not None:
                if what == "action":
                    out.append(int(entry.action))
                elif what == "class":
                    out.append(entry.failure_class.value)
                elif kind == "fault_code":
                    out.append(NPU_LEVEL_RANK.get(faultcodes.level_name(entry.level), 0.0))
                else:
                    out.append(entry.level.strip().upper())
        return out

    return values


# field -> (values of a line, convert a written value, ordered?)
_FIELD_SPECS: dict[str, tuple[Callable[[_Facts], list], Callable[[str], Any], bool]] = {
    "level": (lambda f: f.get("level"), _level, True),
    "rank": (lambda f: f.get("rank"), _int, True),
    "node": (lambda f: f.get("node"), str, False),
    "exit_code": (lambda f: f.get("exit_code"), _int, True),
    "signal": (lambda f: f.get("signal"), _signal, False),
    "nccl_op": (lambda f: f.get("nccl_op"), linefacts.normalise_op, False),
    "xid": (_table_values("xid", "code"), lambda v: str(_int(v)), False),
    "fault_code": (_table_values("fault_code", "code"), faultcodes.normalise_npu, False),
    "dcgm": (_table_values("dcgm", "code"), str.upper, False),
    "xid.level": (_table_values("xid", "level"), str.upper, False),
    "fault_code.level": (_table_values("fault_code", "level"), _npu_level, True),
}
for _kind in _KINDS:
    _FIELD_SPECS[f"{_kind}.action"] = (_table_values(_kind, "action"), _action, True)
    _FIELD_SPECS[f"{_kind}.class"] = (_table_values(_kind, "class"), _failure_class, False)
assert set(_FIELD_SPECS) == set(FIELDS)

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def _compare(expr: Compare) -> _Test:
    if expr.field not in _FIELD_SPECS:
        raise ConditionError(f"unknown field {expr.field!r}; fields are {', '.join(FIELDS)}")
    values, convert, ordered = _FIELD_SPECS[expr.field]
    if expr.field == "xid":                      # xid numbers order, as numbers
        ordered = True
    try:
        if expr.op == "in":
            if isinstance(expr.value, str):
                groups = _groups().get(expr.field, {})
                if expr.value not in groups:
                    known = ", ".join(groups) or "none; write a list: [a, b]"
                    raise ValueError(f"unknown group {expr.value!r} (groups of {expr.field}: {known})")
                wanted = groups[expr.value]
            else:
                wanted = frozenset(convert(v) for v in expr.value)
            return lambda f: any(v in wanted for v in values(f))
        if expr.op in _ORDERED and not ordered:
            raise ValueError(f"{expr.op!r} needs an ordered field; {expr.field} takes == != in")
        target = convert(expr.value)
    except ValueError as exc:
        raise ConditionError(f"{expr.field}: {exc}") from None
    if expr.field == "xid":
        number, op = int(target), _OPS[expr.op]
        return lambda f: any(op(int(v), number) for v in values(f))
    op = _OPS[expr.op]
    return lambda f: any(op(v, target) for v in values(f))
