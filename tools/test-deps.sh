#!/bin/sh
# Debian packages that some tests need (`make test-deps`; `make test` runs it). Idempotent: a
# package whose command is already there is skipped. Not root, or no apt: says why and goes on
# (the tests that need the command then skip with a reason).
set -u

need() {  # need <command> <debian package>
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "test-deps: $1 missing; not root, so not installing $2 (its tests will skip)"; return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "test-deps: $1 missing and no apt-get to install $2 (its tests will skip)"; return 0
    fi
    if [ -z "${_apt_updated:-}" ]; then
        apt-get update -qq >/dev/null 2>&1 || echo "test-deps: apt-get update failed"
        _apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null \
        || echo "test-deps: could not install $2 (its tests will skip)"
}

# tests/alerting/test_alertmanager.py: a real Alertmanager (the package's service is not used;
# the test starts its own instance on a free loopback port).
need prometheus-alertmanager prometheus-alertmanager
# tests/report/test_report_browser.py: the report opened in headless Chromium (driven by the
# playwright Python package through executable_path; Playwright's own browsers are never fetched).
need chromium chromium
# tests/integration/test_prometheus_scrape.py: a real Prometheus scraping /metrics (the test
# starts its own instance on a free loopback port; the package's service is not used).
need prometheus prometheus
# tests/integration/test_slurm_real.py: a real Slurm on localhost (slurm-wlm: slurmctld, slurmd and
# the client commands; munge for its authentication). The test starts its own munged, slurmctld and
# slurmd with its own config, sockets and ports; the packages' services are not used.
need slurmctld slurm-wlm
need sbatch slurm-wlm
need munged munge
exit 0
