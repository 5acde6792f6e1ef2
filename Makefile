# Two commands do all the set-up: `make reproduce` (the main job) and `make test` (the test suite).
# Both create or refresh .venv when pyproject.toml changed; a second run reinstalls nothing.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.vitlab-installed
EXTRAS ?= dev,notebooks,ray
OUT    ?= out

.PHONY: reproduce test test-slow bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "vitlab needs Python >= 3.11, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

reproduce: $(STAMP)
	$(VENV)/bin/vitlab reproduce --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
