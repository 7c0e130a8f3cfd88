# Two commands set everything up on a fresh machine: `make demo` installs the bot and runs
# the demo; `make test` adds the bridges' frameworks and the test tools, and runs the checks.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
LOWEST := build/venv-lowest
LINTED := nodbot/__init__.py core bot tests examples docs/hooks docs/shots.py $(wildcard bench)

.PHONY: demo test test-lowest install-check lint typecheck pytest docs bench lock upgrade clean

# Every install is uv's, from uv.lock: one file pins every package of every extra with its
# hashes, for Linux and macOS, so the demo, the tests, CI and the image (Dockerfile) run the
# same versions; `uv sync --locked` refuses a lock older than pyproject.toml, and uv installs
# in seconds what pip took half a minute for. uv itself is pinned here and installed with pip
# into build/, outside the venv.
UV_VERSION := 0.13.9
UV         := build/uv-$(UV_VERSION)/bin/uv
LOG        := build/install.log
export UV_PROJECT_ENVIRONMENT := $(VENV)
export UV_PYTHON_DOWNLOADS    := never
# Compiled at install, as pip does: else the first run (and every run, with
# PYTHONDONTWRITEBYTECODE set) compiles each module it imports, a second more for the demo.
export UV_COMPILE_BYTECODE    := 1

# $(call step,what,command): one `nodbot: what` line instead of the installer's output; if
# the command fails, its whole log is shown (and kept in build/install.log).
define step
	@mkdir -p build; echo "nodbot: $(1)"; \
	if ! { $(2); } >$(LOG) 2>&1; then \
		cat $(LOG) >&2; echo "nodbot: failed: $(1) (the log above is $(LOG))" >&2; exit 1; \
	fi
endef

$(UV):
	$(call step,installing uv $(UV_VERSION) into build/ with pip,$(PYTHON) -m pip install --disable-pip-version-check --no-warn-script-location --target build/uv-$(UV_VERSION) uv==$(UV_VERSION))

$(BIN)/python: | $(UV)
	$(call step,creating the virtual environment $(VENV) with $(PYTHON),$(UV) venv --python $(PYTHON) $(VENV))

# The demo's packages: nodbot and the bot extra, nothing else. --inexact keeps what `make
# test` added. Reinstalled only when the project's metadata or the lock change.
$(VENV)/.bot-installed: pyproject.toml uv.lock | $(BIN)/python
	$(call step,installing nodbot and the bot's packages from uv.lock,$(UV) sync --locked --inexact --extra bot)
	@touch $@

# The rest: every bridge's framework and the test tools.
$(VENV)/.installed: pyproject.toml uv.lock | $(BIN)/python
	$(call step,installing nodbot with the bridges' frameworks and the test tools from uv.lock,$(UV) sync --locked --inexact --extra test)
	@echo "nodbot: installed; the nodbot command is $(BIN)/nodbot"
	@touch $@

# The bot on SQLite with the example support agent; it prints how to decide the paused call.
demo: $(VENV)/.bot-installed
	@$(BIN)/python examples/bot_demo.py

lint: $(VENV)/.installed
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

typecheck: $(VENV)/.installed
	$(BIN)/mypy -p nodbot

pytest: $(VENV)/.installed
	$(BIN)/pytest

test: lint typecheck pytest

# The suite on the lowest versions pyproject.toml allows for nodbot's own requirements (the
# packages they bring are the newest that fit), in a venv of its own; CI runs it after
# `make test`, which runs the versions uv.lock pins.
$(LOWEST)/.installed: pyproject.toml | $(UV)
	$(call step,creating the virtual environment $(LOWEST) with $(PYTHON),$(UV) venv --clear --python $(PYTHON) $(LOWEST))
	$(call step,installing the lowest versions pyproject.toml allows into $(LOWEST),$(UV) pip install --python $(LOWEST)/bin/python --resolution lowest-direct -e '.[test]')
	@touch $@

test-lowest: $(LOWEST)/.installed
	$(LOWEST)/bin/pytest -p no:cacheprovider

# What an agent application gets from `pip install nodbot`: the base wheel, installed by pip
# from the package index (the newest versions its ranges allow) into a fresh venv, holds
# none of the bot's packages, imports the client and a bridge, and `nodbot` says what to
# install. It reaches the package index: CI runs it, the tests do not.
CHECK := build/install-check
install-check: $(VENV)/.installed
	@rm -rf $(CHECK) && mkdir -p $(CHECK)
	$(call step,building the base wheel,$(BIN)/python -m pip wheel --no-deps --no-build-isolation -w $(CHECK) .)
	$(call step,installing it with pip into a fresh venv $(CHECK)/venv,$(PYTHON) -m venv $(CHECK)/venv && $(CHECK)/venv/bin/pip install --disable-pip-version-check $(CHECK)/nodbot-*.whl)
	@$(CHECK)/venv/bin/pip list --format=freeze --disable-pip-version-check >$(CHECK)/installed.txt
	@if grep -i -E '^(starlette|uvicorn|slack[-_]bolt|slack[-_]sdk|aiosmtpd|aiosmtplib|aioimaplib)==' $(CHECK)/installed.txt; then \
		echo "nodbot: failed: the base install has the bot's packages above" >&2; exit 1; fi
	@$(CHECK)/venv/bin/python -c 'import nodbot, nodbot.core.client, nodbot.core.bridges.common'
	@! $(CHECK)/venv/bin/nodbot serve 2>$(CHECK)/nodbot.txt && grep -q "pip install 'nodbot\[bot\]'" $(CHECK)/nodbot.txt \
		|| { cat $(CHECK)/nodbot.txt >&2; echo "nodbot: failed: nodbot did not say what to install" >&2; exit 1; }
	@echo "nodbot: the base install holds $$(wc -l <$(CHECK)/installed.txt) packages, none of the bot's"

# The docs site (docs/, mkdocs.yml) into site/; a warning (a broken link, a page left out of
# the navigation) fails the build.
$(VENV)/.docs-installed: pyproject.toml uv.lock | $(VENV)/.installed
	$(call step,installing the docs' packages from uv.lock,$(UV) sync --locked --inexact --extra test --extra docs)
	@touch $@

# NO_MKDOCS_2_WARNING: Material's banner on its end of life (May 2027), which docs/README.md
# answers, printed on every build otherwise.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Benchmarks print figures (they are not tests); they also install the peers they compare with.
$(VENV)/.bench-installed: pyproject.toml uv.lock | $(VENV)/.installed
	$(call step,installing the benchmarks' peers from uv.lock,$(UV) sync --locked --inexact --extra test --extra bench)
	@touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python bench/cycle.py
	$(BIN)/python bench/notices.py
	$(BIN)/python bench/list_pending.py
	$(BIN)/python bench/bot.py
	$(BIN)/python bench/replicas.py
	$(BIN)/python bench/counts.py
	$(BIN)/python bench/requests.py
	$(BIN)/python bench/slack.py
	$(BIN)/python bench/mail.py

# After changing pyproject.toml: `make lock` pins what it adds (and keeps the pins that still
# fit); `make upgrade` pins the newest versions its ranges allow. Then `make test`.
lock: | $(UV)
	$(UV) lock

upgrade: | $(UV)
	$(UV) lock --upgrade

clean:
	rm -rf $(VENV) build site .venv-awaithumans .mypy_cache .pytest_cache .ruff_cache
