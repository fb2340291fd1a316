"""The rule-condition language (SPEC P4): a ``when:`` text -> an AST, with pyparsing, at load time.

This module only parses: it knows the shape of a condition, not what a field means. The rules
stage (``ftwatch.rules.conditions``) checks the fields and values and compiles the AST into the
matcher's prefilter plus a per-hit Python predicate; pyparsing never runs per log line.

Grammar (EBNF; ``not`` binds tighter than ``and``, ``and`` tighter than ``or``)::

    condition = or_expr ;
    or_expr   = and_expr , { "or" , and_expr } ;
    and_expr  = not_expr , { "and" , not_expr } ;
    not_expr  = "not" , not_expr | atom ;
    atom      = "(" , condition , ")" | text | compare ;
    text      = [ "keyword" | "regex" ] , string ;        (* a bare string is a keyword *)
    compare   = field , op , value | field , "in" , ( list | name ) ;
    field     = name , [ "." , name ] ;                    (* level, rank, xid, fault_code.level ... *)
    op        = "==" | "!=" | "<" | "<=" | ">" | ">=" ;
    list      = "[" , value , { "," , value } , "]" ;
    value     = string | word ;                            (* word: -9, 79, INFO, SIGKILL, 80C98002 *)
    string    = '"' , { char | '""' } , '"' | "'" , { char | "''" } , "'" ;

Strings have no backslash escapes (a regex keeps its backslashes as written); a quote of the
same kind is written twice. Words ``and``, ``or``, ``not``, ``in``, ``keyword``, ``regex`` are
reserved (lower case).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import pyparsing as pp

__all__ = ["Text", "Compare", "Not", "And", "Or", "Expr", "ConditionSyntaxError", "parse_condition",
           "render", "to_tuple", "from_tuple", "OPS"]

OPS: tuple[str, ...] = ("==", "!=", "<=", ">=", "<", ">")
"""The comparison operators (``in`` apart)."""

RESERVED = frozenset({"and", "or", "not", "in", "keyword", "regex"})


@dataclass(frozen=True, slots=True)
class Text:
    """A literal (``kind="keyword"``) or regex (``kind="regex"``) looked for in the raw line."""

    kind: str
    value: str


@dataclass(frozen=True, slots=True)
class Compare:
    """``field op value``; for ``in``, ``value`` is a tuple (a list) or a str (a named group)."""

    field: str
    op: str
    value: Union[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Not:
    """``not operand``."""

    operand: "Expr"


@dataclass(frozen=True, slots=True)
class And:
    """``a and b and ...`` (two or more operands)."""

    operands: tuple["Expr", ...]


@dataclass(frozen=True, slots=True)
class Or:
    """``a or b or ...`` (two or more operands)."""

    operands: tuple["Expr", ...]


Expr = Union[Text, Compare, Not, And, Or]


class ConditionSyntaxError(ValueError):
    """A condition that does not parse.

    Attributes:
        column: 1-based column in the condition text where parsing failed.
        reason: what was expected, in words.
    """

    def __init__(self, reason: str, column: int):
        super().__init__(f"{reason} (column {column} of the condition)")
        self.reason, self.column = reason, column


@functools.lru_cache(maxsize=1)
def _grammar() -> pp.ParserElement:
    """The grammar, built at the first parse: pyparsing is imported only then (a start whose rule
    files all come from the rule cache, ``ftwatch.rules.rulecache``, parses nothing)."""
    import pyparsing as pp
    kw = {w: pp.Keyword(w) for w in RESERVED}
    string = (pp.QuotedString('"', esc_quote='""', multiline=False, convert_whitespace_escapes=False)
              | pp.QuotedString("'", esc_quote="''", multiline=False, convert_whitespace_escapes=False)).set_name("quoted string")
    word = pp.Regex(r"(?!(?:and|or|not|in|keyword|regex)\b)-?[A-Za-z0-9_][A-Za-z0-9_.:/+-]*").set_name("value")
    value = (string | word).set_name("value")
    name = pp.Regex(r"(?!(?:and|or|not|in|keyword|regex)\b)[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?")
    field = name.copy().set_name("field")
    op = pp.one_of(list(OPS)).set_name("comparison (== != < <= > >=)")
    listing = (pp.Suppress("[") + pp.DelimitedList(value, ",") + pp.Suppress("]")).set_name("[list]")
    listing.set_parse_action(lambda t: [tuple(t)])
    tail = ((op - value) | (kw["in"] - (listing | name.copy().set_name("group name"))))
    tail.set_name("an operator (== != < <= > >= in)")
    compare = (field + tail).set_parse_action(lambda t: Compare(t[0], t[1], t[2]))
    text = ((kw["keyword"] | kw["regex"]) - string).set_parse_action(lambda t: Text(t[0], t[1]))
    bare = string.copy().set_parse_action(lambda t: Text("keyword", t[0]))
    condition = pp.Forward()
    atom = (pp.Suppress("(") - condition - pp.Suppress(")")) | text | bare | compare
    not_expr = pp.Forward()
    not_expr <<= ((kw["not"].suppress() - not_expr).set_parse_action(lambda t: Not(t[0])) | atom).set_name(
        "a term (keyword, regex, comparison, not, or a condition in parentheses)")
    and_expr = (not_expr + pp.ZeroOrMore(kw["and"].suppress() - not_expr)).set_parse_action(
        lambda t: t[0] if len(t) == 1 else And(tuple(t)))
    or_expr = (and_expr + pp.ZeroOrMore(kw["or"].suppress() - and_expr)).set_parse_action(
        lambda t: t[0] if len(t) == 1 else Or(tuple(t)))
    condition <<= or_expr
    return condition



def parse_condition(text: str) -> Expr:
    """Parses one condition.

    Args:
        text: the ``when:`` text (may span lines).

    Returns:
        The AST (``Text``, ``Compare``, ``Not``, ``And``, ``Or``).

    Raises:
        ConditionSyntaxError: the text is empty or does not parse; says where.
    """
    if not text.strip():
        raise ConditionSyntaxError("empty condition", 1)
    grammar = _grammar()
    import pyparsing as pp
    try:
        return grammar.parse_string(text, parse_all=True)[0]
    except pp.ParseBaseException as exc:
        found = text[exc.loc:exc.loc + 20].split("\n")[0]
        where = f"found {found!r}" if found else "found the end"
        raise ConditionSyntaxError(f"{exc.msg}, {where}", exc.loc + 1) from None


def _quote(value: str) -> str:
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    return '"' + value.replace('"', '""') + '"'


_WORD = re.compile(r"-?[A-Za-z0-9_][A-Za-z0-9_.:/+-]*")


def _value(value: str) -> str:
    # re.fullmatch, not pyparsing's matches(parse_all=True): that skips trailing whitespace, so
    # "0 " would render bare and parse back as "0" (a hypothesis case)
    if value and value not in RESERVED and _WORD.fullmatch(value):
        return value
    return _quote(value)


def render(expr: Expr) -> str:
    """The condition as text, fully parenthesised where needed: ``parse_condition(render(e)) == e``."""
    if isinstance(expr, Text):
        return f"{expr.kind} {_quote(expr.value)}"
    if isinstance(expr, Compare):
        if expr.op == "in":
            if isinstance(expr.value, tuple):
                return f"{expr.field} in [{', '.join(_value(v) for v in expr.value)}]"
            return f"{expr.field} in {expr.value}"
        return f"{expr.field} {expr.op} {_value(expr.value)}"
    if isinstance(expr, Not):
        inner = render(expr.operand)
        return f"not {inner}" if isinstance(expr.operand, (Text, Compare, Not)) else f"not ({inner})"
    word = " and " if isinstance(expr, And) else " or "
    parts = []
    for e in expr.operands:
        s = render(e)
        parts.append(f"({s})" if isinstance(e, (And, Or)) else s)
    return word.join(parts)


def to_tuple(expr: Expr) -> tuple:
    """The AST as nested tuples of strings (``marshal``-able: the rule cache keeps it, so a warm
    start parses nothing); :func:`from_tuple` builds it back, ``from_tuple(to_tuple(e)) == e``."""
    if isinstance(expr, Text):
        return ("t", expr.kind, expr.value)
    if isinstance(expr, Compare):
        return ("c", expr.field, expr.op, expr.value)
    if isinstance(expr, Not):
        return ("n", to_tuple(expr.operand))
    return ("a" if isinstance(expr, And) else "o", tuple(to_tuple(e) for e in expr.operands))


def from_tuple(t: tuple) -> Expr:
    """The AST of :func:`to_tuple`'s tuples (raises ``ValueError`` on a tuple it did not make)."""
    tag = t[0]
    if tag == "t":
        return Text(t[1], t[2])
    if tag == "c":
        return Compare(t[1], t[2], t[3])
    if tag == "n":
        return Not(from_tuple(t[1]))
    if tag in ("a", "o"):
        return (And if tag == "a" else Or)(tuple(from_tuple(e) for e in t[1]))
    raise ValueError(f"not a condition tuple: {t!r}")
