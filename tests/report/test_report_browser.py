"""``ftwatch report`` end to end: a real ``ftwatch run`` fills the store, the page is opened in a real
headless Chromium (Debian's ``chromium``, driven by Playwright; no browser is downloaded).

The job is a small plain-Python worker (no torch) written to tmp_path: attempt 0, rank 1 prints an
NCCL error and SIGKILLs itself (restart_job); attempt 1, every rank falls silent (a job hang after
2 s: restart_job); attempt 2 finishes. So the page has findings, two restarts, a hang, three
decisions and the output of both instances. Skipped when chromium or playwright is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftwatch.testing import write_nccl_crash_worker

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def ftwatch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_report_of_a_missing_store_fails_clearly(tmp_path: Path):
    proc = ftwatch("report", "--state-dir", str(tmp_path / "none"), cwd=tmp_path, timeout=60)
    assert proc.returncode == 1 and "no store at" in proc.stderr
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian package `chromium`; make test-deps installs it)")
def test_the_report_of_a_real_run_renders_its_plots_in_chromium(tmp_path: Path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    write_nccl_crash_worker(tmp_path / "worker.py", steps=6, loss=True, hang_on_retry=True)
    (tmp_path / "ftwatch.yaml").write_text("storage:\n  metrics:\n    output_bucket: 0.5\n")
    run = ftwatch("run", "--config", "ftwatch.yaml", "--job-id", "report-e2e", "--nproc-per-node", "2",
                  "--state-dir", "state", "--grace-period", "1", "--enable-job-restart=True",
                  "--max-num-of-job-restart=3", "--enable-job-hang-detection=True", "--job-hang-interval=2",
                  "--", sys.executable, "worker.py", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "out" / "report.html"
    rep = ftwatch("report", "--state-dir", "state", "-o", str(out), cwd=tmp_path, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert str(out) in rep.stdout

    problems: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(out.as_uri())
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=15_000)
            charts = page.evaluate("""() => window.ftwatchReport.charts.map(c => ({
                kind: c.kind, points: c.points,
                sets: Object.fromEntries(c.chart.data.datasets.map(d => [d.label, d.data.length])),
                labels: c.chart.data.labels || [],
                values: c.chart.data.datasets.length ? c.chart.data.datasets[0].data : [],
                painted: (() => { const cv = c.chart.canvas, px = cv.getContext('2d')
                    .getImageData(0, 0, cv.width, cv.height).data; let n = 0;
                    for (let i = 3; i < px.length; i += 4) if (px[i]) n++; return n; })()}))""")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            root_causes = page.locator("table.root-causes tr").count()
        finally:
            browser.close()

    assert problems == []
    assert all(u.startswith("file://") for u in requests), requests     # nothing from the network
    by_kind = {c["kind"]: c for c in charts}
    assert list(by_kind) == ["timeline", "output", "actions", "classes"]
    assert all(c["painted"] > 500 for c in charts), [(c["kind"], c["painted"]) for c in charts]
    timeline = by_kind["timeline"]["sets"]
    assert timeline["hang"] == 1 and timeline["restart"] == 2 and timeline["decision"] == 3
    assert timeline["error findings"] >= 2                 # the NCCL line and the SIGKILL exit
    assert next(v for k, v in timeline.items() if k.startswith("instance running")) == 6   # 3 attempts x 2
    assert by_kind["timeline"]["labels"] == ["job", "worker-0", "worker-1"]
    assert by_kind["output"]["sets"].keys() == {"worker-0", "worker-1"}
    assert min(by_kind["output"]["sets"].values()) >= 3
    actions = dict(zip(by_kind["actions"]["labels"], by_kind["actions"]["values"]))
    assert actions == {"restart_job": 2, "none": 1}
    assert {"hang", "retryable_infra"} <= set(by_kind["classes"]["labels"])
    assert root_causes == 3                                 # header + the two restarts' root causes
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
