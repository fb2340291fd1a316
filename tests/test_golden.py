"""Golden replays: real multi-rank logs recorded here (torchrun + the example trainer, paths
scrubbed) -> the decision `ftwatch replay --json` must print (tests/golden/<case>/expected.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p for p in GOLDEN.iterdir() if (p / "expected.json").exists())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden_replay(case: Path):
    """The recorded logs replay to the expected action and root cause."""
    expected = json.loads((case / "expected.json").read_text())
    logs = sorted(str(p) for p in case.iterdir() if p.suffix in (".log", ".out", ".err"))
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "replay", "--json", *expected["flags"], *logs],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    decision = json.loads(proc.stdout.strip().splitlines()[-1])
    assert decision["action"] == expected["action"], decision
    rc = decision["root_cause"]
    if expected["rule_id"] is None:
        assert rc is None
    else:
        assert rc["rule_id"] == expected["rule_id"], rc
        assert rc["rank"] == expected["rank"], rc
        assert rc["failure_class"] == expected["failure_class"], rc
