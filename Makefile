# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
LINTED := nodbot/__init__.py core bot tests examples $(wildcard bench)

.PHONY: demo test lint typecheck pytest docs bench clean

# uv, when it is on the PATH, installs from its cache in seconds; pip otherwise.
UV     := $(shell command -v uv)

$(BIN)/python:
	@echo "nodbot: creating the virtual environment $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's metadata changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
ifneq ($(UV),)
	@echo "nodbot: installing nodbot and its packages into $(VENV) with uv"
	$(UV) pip install --python $(BIN)/python -e '.[test]'
else
	@echo "nodbot: installing nodbot and its packages into $(VENV) with pip (uv is faster)"
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -e '.[test]'
endif
	@echo "nodbot: installed; the nodbot command is $(BIN)/nodbot"
	touch $@

# The bot on SQLite with the example support agent; it prints how to decide the paused call.
demo: $(VENV)/.installed
	$(BIN)/python examples/bot_demo.py

lint: $(VENV)/.installed
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

typecheck: $(VENV)/.installed
	$(BIN)/mypy -p nodbot

pytest: $(VENV)/.installed
	$(BIN)/pytest

test: lint typecheck pytest

# The docs site (docs/, mkdocs.yml) into site/; a warning (a broken link, a page left out of
# the navigation) fails the build.
$(VENV)/.docs-installed: pyproject.toml | $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	$(BIN)/mkdocs build --strict --site-dir site

# Benchmarks print figures (they are not tests); they also install the peers they compare with.
$(VENV)/.bench-installed: pyproject.toml | $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python bench/cycle.py
	$(BIN)/python bench/notices.py
	$(BIN)/python bench/list_pending.py
	$(BIN)/python bench/bot.py
	$(BIN)/python bench/counts.py
	$(BIN)/python bench/requests.py
	$(BIN)/python bench/slack.py
	$(BIN)/python bench/mail.py

clean:
	rm -rf $(VENV) site .venv-awaithumans .mypy_cache .pytest_cache .ruff_cache
