# Two commands do all the set-up: `make reproduce` (the main job) and `make test` (the test suite).
# Both create or refresh .venv when pyproject.toml changed; a second run reinstalls nothing.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.vitlab-installed
EXTRAS ?= dev,docs,notebooks,ray
OUT    ?= out

.PHONY: reproduce test test-slow bench docs sweep scaling-study install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "vitlab needs Python >= 3.11, found " + sys.version.split()[0]'
	@# a venv without a working pip (e.g. a half-made one) is made again
	@$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV); $(PYTHON) -m venv $(VENV) || { \
		echo "could not create $(VENV) with $(PYTHON): install its venv module (Debian/Ubuntu: apt-get install python3-venv), then rerun" >&2; \
		rm -rf $(VENV); exit 1; }; }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

reproduce: $(STAMP)
	$(VENV)/bin/vitlab reproduce --out $(OUT)

# The suite on every core: pytest-xdist's -n auto, two workers per core (tests/conftest.py; each on one thread), a
# test file's tests on one worker, so what they share (module fixtures, notebook runs) is made once. TEST_WORKERS=0
# runs it in one process; PYTEST_ARGS adds pytest options (a selection such as -m cifar10).
TEST_WORKERS ?= auto
PYTEST_ARGS  ?=
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# The benchmarks write benchmarks/results/*.json; benchmarks.markdown then writes BENCHMARKS.md from those files.
bench: $(STAMP)
	$(PY) -m benchmarks
	$(PY) -m benchmarks.markdown

# The documentation site (docs/, mkdocs.yml) into site/; tests/test_docs.py builds it the same way.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

# The shipped data-scaling sweep (data/results/scaling_cifar10.*): tune each family on the largest subset, freeze
# the recipes, run the grid and draw it. Resumable: a second run skips what is done with this code. Measured: 38.5 min
# on 2 cores with AVX512-BF16 (bf16); about 3 h is the estimate for 2 AVX2-only cores (float32).
SWEEP_RESULTS ?= data/results/scaling_cifar10
sweep: $(STAMP)
	$(VENV)/bin/vitlab sweep --config cifar10 --tune --results $(SWEEP_RESULTS).jsonl \
		--save-config $(SWEEP_RESULTS).tuned.json --workers 2
	$(VENV)/bin/vitlab sweep --config $(SWEEP_RESULTS).tuned.json --results $(SWEEP_RESULTS).jsonl --workers 2 --shots 10 \
		--plot $(SWEEP_RESULTS).png

# The data-scaling study with the power to decide (issue 48: sweep cifar10_10k into data/results/scaling_cifar10_10k.*):
# tune once on the largest subset (skipped once the frozen config exists; an interrupted tuning skips its finished
# trials), then run the grid for at most HOURS hours (runs in flight finish), then print the tables. Resumable: run it
# again, day after day, until the table counts every run. The plan of its CPU hours: docs/studies.md.
# One code version across those days: a record counts as done only for the code that made it (its fingerprint holds
# the package's source hash), so the study runs the package of commit STUDY_CODE, checked out once into a git
# worktree (STUDY_TREE), whatever this checkout holds meanwhile. STUDY_CODE= (empty) runs this checkout's code: a new
# study, which finds none of the shipped records done.
STUDY_RESULTS ?= data/results/scaling_cifar10_10k
STUDY_CONFIG  ?= cifar10_10k
STUDY_CODE    ?= 32f5b38
STUDY_TREE    ?= .study/$(STUDY_CODE)
HOURS ?= 8
STUDY_AT  := $(if $(STUDY_CODE),$(abspath $(STUDY_TREE)),$(CURDIR))
STUDY_OUT := $(abspath $(STUDY_RESULTS))
STUDY_RUN := cd $(STUDY_AT) && PYTHONPATH=$(STUDY_AT) $(abspath $(PY)) -m vitlab sweep
scaling-study: $(STAMP)
ifneq ($(STUDY_CODE),)
	@git rev-parse --verify --quiet "$(STUDY_CODE)^{commit}" >/dev/null || { echo "STUDY_CODE=$(STUDY_CODE) is no \
	commit of this git checkout: the study runs one commit's code; run it from a git clone, or set STUDY_CODE= to run \
	this checkout's code as a new study" >&2; exit 1; }
	test -d $(STUDY_AT) || git worktree add --detach $(STUDY_AT) $(STUDY_CODE)
	@test "$$(git -C $(STUDY_AT) rev-parse HEAD)" = "$$(git rev-parse "$(STUDY_CODE)^{commit}")" || { echo \
	"$(STUDY_AT) holds another commit than STUDY_CODE=$(STUDY_CODE): remove it (git worktree remove) or set STUDY_TREE" >&2; exit 1; }
endif
	test -f $(STUDY_OUT).tuned.json || ( $(STUDY_RUN) --config $(STUDY_CONFIG) --tune \
		--results $(STUDY_OUT).jsonl --save-config $(STUDY_OUT).tuned.json --workers 2 )
	$(STUDY_RUN) --config $(STUDY_OUT).tuned.json --results $(STUDY_OUT).jsonl --workers 2 --shots 10 --hours $(HOURS)
	$(STUDY_RUN) --config $(STUDY_OUT).tuned.json --results $(STUDY_OUT).jsonl --table

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache site
