"""Issue 16 (bounds), end to end: a real ``ftwatch run`` with a short full-resolution window merges
its old output counts into coarser buckets as it writes them, the sums stay exact, and
``ftwatch report`` plots them."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ftwatch.pipeline.sinks.sqlite import SqliteStore

WORKER = """import time
for i in range(40):
    print(f"step {i} loss 0.5", flush=True)
    time.sleep(0.1)
"""


def ftwatch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_a_real_run_merges_its_old_output_counts_and_the_report_reads_them(tmp_path: Path):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "c.yaml").write_text("storage:\n  metrics:\n    output_bucket: 0.1\n"
                                     "    output_full_window: 1.0\n    output_coarse_bucket: 0.5\n")
    run = ftwatch("run", "--config", "c.yaml", "--job-id", "bounds", "--nproc-per-node", "2",
                  "--state-dir", "st", "--", sys.executable, "worker.py", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    with SqliteStore(tmp_path / "st" / "ftwatch.db") as store:
        rows = store.output("bounds")
    assert sum(r["lines"] for r in rows) == 80                         # 40 lines from each of 2 workers
    merged = [r for r in rows if r["seconds"] == 0.5]
    newest = max(r["bucket"] for r in rows)
    assert merged and {r["instance"] for r in merged} == {"worker-0", "worker-1"}
    assert max(r["bucket"] + 0.5 for r in merged) <= newest - 1.0 + 1e-6  # only what fell out of the window
    assert min(r["bucket"] for r in rows if r["seconds"] == 0.1) > newest - 1.5
    out = tmp_path / "report.html"
    rep = ftwatch("report", "--state-dir", "st", "-o", str(out), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    data = json.loads(html.unescape(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                              out.read_text(), re.S).group(1)))
    (job,) = data["jobs"]
    assert job["totals"]["lines"] == 80
    plotted = {s["instance"]: s["points"] for s in job["output"]["series"]}
    assert set(plotted) == {"worker-0", "worker-1"} and job["output"]["bucket"] == 0.1
    assert all(abs(sum(p[1] for p in pts[:-1]) - 40) < 0.01 * len(pts) for pts in plotted.values())
