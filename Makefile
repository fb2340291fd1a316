# The verbs. `make run` and `make test` do all set-up on a fresh machine themselves.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
STATE   ?= .ftwatch-state

.PHONY: install run test test-deps bench soak check lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -qq --disable-pip-version-check -e '.[test,torch]'
	touch $(STAMP)

install: $(STAMP)

# The main job on its embedded defaults: a real 3-worker DDP trainer (gloo) with one rank
# SIGKILLed in its first attempt; ftwatch decides restart_job and the training resumes and finishes.
# Then the HTML report of the run (timeline, decisions, failure classes, root causes), written
# whether the job succeeded or not; make's status is the run's.
run: $(STAMP)
	rm -rf $(STATE)
	FTWATCH_INJECT_FAULT=sigkill $(BIN)/ftwatch run --state-dir $(STATE) --nproc-per-node 3 \
	    --enable-job-restart=True --max-num-of-job-restart=3 \
	    --enable-job-hang-detection=True --job-hang-interval=60 \
	    -- $(BIN)/python examples/train_ddp.py --steps 30 --checkpoint-dir $(STATE)/ckpt; \
	status=$$?; $(BIN)/ftwatch report --state-dir $(STATE) -o $(STATE)/report.html; exit $$status

# Debian packages some tests need (prometheus-alertmanager, chromium, prometheus, slurm-wlm, munge); skipped with a
# reason when not root.
test-deps:
	sh tools/test-deps.sh

test: $(STAMP) test-deps
	$(BIN)/python -m pytest -q

# Every bench/bench_*.py in one run, each figure against its goal (bench/run.py); ripgrep is
# installed for the comparison when missing (apt as root, else pip's ripgrep wheel).
bench: $(STAMP)
	@command -v rg >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq ripgrep >/dev/null 2>&1; } \
		|| $(BIN)/pip install -qq --disable-pip-version-check ripgrep || echo "ripgrep not installed: no rg figures"
	PATH="$(BIN):$$PATH" $(BIN)/python bench/run.py $(BENCH_PARTS)

# Not part of `make test`: ftwatch under abuse for about 5 minutes (fuzzed listeners, kill -9 of
# watch and run, receivers down, RSS over time), each figure against its goal; non-zero status
# when a goal is missed. SOAK_SCALE=3 runs it three times longer; SOAK_PARTS=1,4 some parts only.
soak: $(STAMP)
	$(BIN)/python -m bench.soak

check: $(STAMP)
	$(BIN)/ftwatch check examples/ftwatch.yaml

clean:
	rm -rf $(VENV) $(STATE) build dist *.egg-info
