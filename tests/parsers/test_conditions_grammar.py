"""The condition grammar (SPEC P4): text -> AST, precedence, parentheses, errors with a column."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftwatch.parsers.grammars.conditions import (OPS, And, Compare, ConditionSyntaxError, Not, Or, Text,
                                                 parse_condition, render, to_tuple, from_tuple)

A, B, C = (Compare(f, "==", "1") for f in ("a", "b", "c"))


@pytest.mark.parametrize("text, expected", [
    ('keyword "NCCL INFO"', Text("keyword", "NCCL INFO")),
    ('"NCCL INFO"', Text("keyword", "NCCL INFO")),                 # a bare string is a keyword
    (r"regex 'Xid \(PCI:[0-9a-f:.]+\): 79'", Text("regex", r"Xid \(PCI:[0-9a-f:.]+\): 79")),
    ('keyword "say ""hi"""', Text("keyword", 'say "hi"')),           # a quote is written twice
    ("level == INFO", Compare("level", "==", "INFO")),
    ("exit_code <= -9", Compare("exit_code", "<=", "-9")),
    ("fault_code.level >= SeparateNPU", Compare("fault_code.level", ">=", "SeparateNPU")),
    ("fault_code == 80C98002", Compare("fault_code", "==", "80C98002")),
    ('node != "gpu-node-7"', Compare("node", "!=", "gpu-node-7")),
    ("xid in fatal", Compare("xid", "in", "fatal")),
    ("signal in [SIGKILL, 15]", Compare("signal", "in", ("SIGKILL", "15"))),
])
def test_atoms(text, expected):
    assert parse_condition(text) == expected


def test_not_binds_tighter_than_and_and_and_tighter_than_or():
    assert parse_condition("a == 1 or b == 1 and c == 1") == Or((A, And((B, C))))
    assert parse_condition("a == 1 and b == 1 or c == 1") == Or((And((A, B)), C))
    assert parse_condition("not a == 1 and b == 1") == And((Not(A), B))
    assert parse_condition("not a == 1 or b == 1") == Or((Not(A), B))
    assert parse_condition("not not a == 1") == Not(Not(A))


def test_parentheses_override_precedence_and_chains_flatten():
    assert parse_condition("(a == 1 or b == 1) and c == 1") == And((Or((A, B)), C))
    assert parse_condition("not (a == 1 and b == 1)") == Not(And((A, B)))
    assert parse_condition("a == 1 and b == 1 and c == 1") == And((A, B, C))
    assert parse_condition("((a == 1))") == A


def test_the_issue_example_parses():
    expr = parse_condition('keyword "No such file or directory" and not (level == INFO and keyword "NCCL INFO")')
    assert expr == And((Text("keyword", "No such file or directory"),
                        Not(And((Compare("level", "==", "INFO"), Text("keyword", "NCCL INFO"))))))


@pytest.mark.parametrize("text, column, fragment", [
    ("", 1, "empty condition"),
    ("   ", 1, "empty condition"),
    ('keyword "x" and (level == INF', 30, "Expected ')'"),
    ('keyword "x" and', 16, "Expected a term"),
    ("not", 4, "Expected a term"),
    ("level = INFO", 7, "an operator"),
    ("keyword x", 9, "quoted string"),
    ("a == 1 b == 2", 8, "end of text"),
    ("x in [1,", 8, "Expected ']'"),
    ('"unterminated', 1, "Expected"),
    ("and == 1", 1, "Expected a term"),                 # reserved words are not fields
])
def test_syntax_errors_name_their_column(text, column, fragment):
    with pytest.raises(ConditionSyntaxError) as info:
        parse_condition(text)
    assert info.value.column == column
    assert fragment in str(info.value) and f"column {column}" in str(info.value)


# -- round trips ------------------------------------------------------------------------------

_NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,6}(\.[a-z_][a-z0-9_]{0,4})?", fullmatch=True).filter(
    lambda s: not ({"and", "or", "not", "in", "keyword", "regex"} & set(s.split("."))))
_VALUE = st.one_of(st.from_regex(r"-?[A-Za-z0-9_][A-Za-z0-9_.:/+-]{0,8}", fullmatch=True),
                   st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=0, max_size=12))
_LEAF = st.one_of(
    st.builds(Text, st.sampled_from(["keyword", "regex"]),
              st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)),
    st.builds(Compare, _NAME, st.sampled_from(OPS), _VALUE),
    st.builds(Compare, _NAME, st.just("in"), st.lists(_VALUE, min_size=1, max_size=3).map(tuple)),
    st.builds(Compare, _NAME, st.just("in"), _NAME.filter(lambda s: "." not in s)),
)


def _tree(children):
    return st.one_of(st.builds(Not, children),
                     st.lists(children, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
                     st.lists(children, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))))


@settings(max_examples=300, deadline=None)
@given(st.recursive(_LEAF, _tree, max_leaves=8))
def test_render_then_parse_gives_the_same_tree(expr):
    assert parse_condition(render(expr)) == expr
    assert render(parse_condition(render(expr))) == render(expr)


@settings(max_examples=200, deadline=None)
@given(st.recursive(_LEAF, _tree, max_leaves=8))
def test_the_tuples_the_rule_cache_keeps_give_the_same_tree(expr):
    """``to_tuple`` / ``from_tuple``: the AST as plain tuples (``marshal``-able) and back."""
    import marshal
    assert from_tuple(marshal.loads(marshal.dumps(to_tuple(expr)))) == expr
