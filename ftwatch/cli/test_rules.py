"""``ftwatch test-rules``: every rule's examples and counterexamples (T2)."""

from __future__ import annotations

import sys

from ftwatch.cli.common import ArgumentParser


def cmd_test_rules(argv: list[str]) -> int:
    p = ArgumentParser(prog="ftwatch test-rules", description="Run every rule's examples and counterexamples.")
    p.add_argument("files", nargs="*", help="rule files (default: the built-in packs only)")
    p.add_argument("--no-builtin", action="store_true")
    args = p.parse_args(argv)
    from ftwatch.rules.loader import load_rules
    from ftwatch.rules.testrules import format_report, run_rule_tests
    rules = load_rules(args.files, builtin=not args.no_builtin)
    failures = run_rule_tests(rules)
    print(format_report(failures, len(rules)))
    return 1 if failures else 0
