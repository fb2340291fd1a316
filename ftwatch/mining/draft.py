"""Draft rules from signatures (``ftwatch mine --draft``): one rule file per signature.

A draft is a keyword rule: the longest run of the template's literal tokens (no ``<NUM>``-style
mask, no ``<*>``) that every example contains and no clean line does. Where no such run exists,
a regex: the template's tokens, each mask a ``\\S+``, joined by ``\\s+`` (RE2/Hyperscan subset).
Class and action are the ones the signature's decisions most often took (a catch-all's verdict
until a person changes them); ``examples`` are the signature's raw lines, ``counterexamples``
clean lines (``--clean``) most like the template that the pattern does not hit. The file loads
with ``ftwatch.rules.loader`` and passes ``ftwatch test-rules`` as written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import yaml

from ftwatch.mining.miner import Signature

_MASK = re.compile(r"^<[A-Z*]+>$|<[A-Z*]+>")
MIN_KEYWORD = 12        # characters: a shorter literal run is too common to be a keyword
MAX_COUNTEREXAMPLES = 3
MIN_LITERAL = 8         # characters of literal text a template needs to be drafted at all


def _literal_runs(template: str) -> list[str]:
    """Runs of consecutive tokens without a mask, longest first."""
    runs, current = [], []
    for token in template.split():
        if _MASK.search(token):
            if current:
                runs.append(" ".join(current))
            current = []
        else:
            current.append(token)
    if current:
        runs.append(" ".join(current))
    return sorted(runs, key=len, reverse=True)


def _template_regex(template: str) -> str:
    parts = [r"\S+" if _MASK.search(t) else re.escape(t) for t in template.split()]
    return r"\s+".join(parts)


def choose_pattern(sig: Signature, clean: Sequence[str] = ()) -> tuple[str, str]:
    """(``keywords`` or ``regex``, the pattern) for ``sig``: see the module docstring."""
    for run in _literal_runs(sig.template):
        if len(run) >= MIN_KEYWORD and all(run in e for e in sig.examples) and not any(run in c for c in clean):
            return "keywords", run
    return "regex", _template_regex(sig.template)


def slug(template: str, limit: int = 40) -> str:
    """A rule-id-safe name from a template's literal words."""
    words = re.findall(r"[a-z0-9]+", _MASK.sub(" ", template).lower())
    return "_".join(words)[:limit].strip("_") or "signature"


def _hits(kind: str, pattern: str, line: str) -> bool:
    return pattern in line if kind == "keywords" else re.search(pattern, line) is not None


def counterexamples(kind: str, pattern: str, sig: Signature, clean: Sequence[str]) -> list[str]:
    """Up to :data:`MAX_COUNTEREXAMPLES` clean lines sharing the most words with the template
    that ``pattern`` does not hit."""
    words = set(_MASK.sub(" ", sig.template).split())
    scored = sorted({c.rstrip("\r\n") for c in clean if c.strip() and not _hits(kind, pattern, c)},
                    key=lambda c: (-len(words & set(c.split())), c))
    return [c for c in scored if words & set(c.split())][:MAX_COUNTEREXAMPLES]


def draft_rule(sig: Signature, clean: Sequence[str] = ()) -> dict[str, Any]:
    """The rule (a dict in the pack schema, ``ftwatch/rules/packs/README.md``) for ``sig``."""
    kind, pattern = choose_pattern(sig, clean)
    examples = [e for e in sig.examples if _hits(kind, pattern, e)]
    rule: dict[str, Any] = {
        "id": f"mined.{slug(sig.template)}_{sig.id}",
        kind: [pattern],
        "class": _suggested_class(sig),
        "action": sig.top("actions") or "notify",
        "severity": "error",
        "priority": 10,
        "tags": ["mined"],
        "source": f"ftwatch mine: signature {sig.id} ({sig.count} lines in {len(sig.jobs)} jobs: "
                  f"{', '.join(sig.jobs[:5])})",
        "description": f"DRAFT from a failure signature: {sig.template}",
        "notes": (f"decisions it ended: rules {sig.rules or 'none'}, actions {sig.actions or 'none'}; "
                  "review class, action and pattern before adding it to rules.files"),
        "examples": examples,
    }
    cex = counterexamples(kind, pattern, sig, clean)
    if cex:
        rule["counterexamples"] = cex
    return rule


def _suggested_class(sig: Signature) -> str:
    cls = sig.top("classes")
    return cls if cls and cls != "info" else "user_code"


def draftable(sig: Signature) -> bool:
    """False for a template with under :data:`MIN_LITERAL` characters of literal text (``[<NUM>]:``,
    a rule line of ``====``): any rule drafted from it would hit nearly every line."""
    return sum(len(run.replace(" ", "")) for run in _literal_runs(sig.template)
               if run.strip("=-*#_.:[]() ")) >= MIN_LITERAL


def write_drafts(signatures: Sequence[Signature], out_dir: Path, clean: Sequence[str] = ()) -> list[Path]:
    """One ``<rule id>.yaml`` per :func:`draftable` signature in ``out_dir`` (created). Returns
    the files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for sig in filter(draftable, signatures):
        rule = draft_rule(sig, clean)
        path = out_dir / f"{rule['id']}.yaml"
        text = ("# Drafted by ftwatch mine from a failure signature: review before use.\n"
                + yaml.safe_dump({"rules": [rule]}, sort_keys=False, allow_unicode=True, width=1000))
        path.write_text(text, encoding="utf-8")
        files.append(path)
    return files
