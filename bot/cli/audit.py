"""`nodbot audit verify|export`: check the hash chains of a store's audit trail, or write
every event out as JSON lines.

```
nodbot audit verify --config nodbot.yml                  # the file's store and audit.key
nodbot audit verify --store postgresql://... --key-env NODBOT_AUDIT_KEY
nodbot audit export --config nodbot.yml --output events.jsonl
```

`verify` prints `ok: N events in M reviews` and exits 0, or prints each problem (naming the
review and the event) and exits 1. Both read one snapshot without a write lock, so they may
run beside the bot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from nodbot.bot.config import load_config
from nodbot.core import NodbotError
from nodbot.core.sqlstore.audit import AuditReport, export, verify

__all__ = ["AuditCommandError", "add_audit_commands", "key_from_environment", "run_audit_command"]


class AuditCommandError(NodbotError):
    """An `audit` command cannot run as asked (a key variable unset, an output not writable)."""

    kind = "audit-command-error"


_NO_KEY_HINT = (
    "no audit key was given: if the store has one, pass it "
    "(--key-env NAME, or audit.key of the file with --config)"
)


def add_audit_commands(commands: Any) -> None:
    """Add `audit verify|export` to the `nodbot` parser."""
    from nodbot.bot.cli.commands import store_url  # the command's own check of a store URL

    audit = commands.add_parser(
        "audit",
        help="verify or export the audit trail",
        description="Check the hash chains of the store's events, or export the events.",
    )
    actions = audit.add_subparsers(dest="action", metavar="ACTION", required=True)
    checking = actions.add_parser(
        "verify",
        help="check every review's hash chain",
        description="Walk every review's chain of events and report each changed, removed "
        "or inserted row, naming the review and the event. Exits 1 when there is any.",
    )
    exporting = actions.add_parser(
        "export",
        help="write every event as JSON lines, oldest first",
        description="Write every event, oldest first, one JSON object a line, with every "
        "column (n, prev and hash included): enough to check the chains again elsewhere.",
    )
    for parser in (checking, exporting):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--config", metavar="FILE", help="nodbot.yml: its store (and key)")
        source.add_argument(
            "--store",
            type=store_url,
            metavar="URL",
            help="sqlite:///path.db or postgresql://user@host/db",
        )
    checking.add_argument(
        "--key-env",
        metavar="NAME",
        help="the environment variable holding the audit key (default with --config: the "
        "file's audit.key)",
    )
    exporting.add_argument("--output", metavar="FILE", help="write to FILE, not stdout")


async def run_audit_command(arguments: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one `audit` command, printing to `out` (stdout); returns the exit status.
    Raises `ConfigError` and `NodbotError`s."""
    out = out or sys.stdout
    if arguments.action == "verify":
        url, key = _source(arguments)
        report = await verify(url, key)
        for line in _lines(report):
            print(line, file=out)
        return 0 if report.ok else 1
    url, _ = _source(arguments)
    with _opened(arguments.output, out) as target:
        written = 0
        async for row in export(url):
            target.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += 1
    if arguments.output is not None:
        print(f"{written} events written to {arguments.output}", file=out)
    return 0


def _source(arguments: argparse.Namespace) -> tuple[str, str | None]:
    """The store URL and the audit key the arguments name."""
    key_env = getattr(arguments, "key_env", None)
    key = key_from_environment(key_env) if key_env else None
    if arguments.config is None:
        return arguments.store, key
    config = load_config(arguments.config)
    return config.store.url, key if key_env else config.audit.secret


def key_from_environment(name: str) -> str:
    """The audit key in the environment variable `name` (`--key-env`). Raises
    `AuditCommandError` when it is unset or empty."""
    value = os.environ.get(name)
    if not value:
        raise AuditCommandError(f"the environment variable {name} (--key-env) is not set")
    return value


def _lines(report: AuditReport) -> Iterator[str]:
    if report.ok:
        yield report.summary()
        return
    yield from (str(problem) for problem in report.problems)
    yield report.summary()
    if not report.keyed and any("hash does not match" in p.message for p in report.problems):
        yield _NO_KEY_HINT


@contextlib.contextmanager
def _opened(path: str | None, out: TextIO) -> Iterator[TextIO]:
    if path is None:
        yield out
        return
    try:
        target = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError as error:
        raise AuditCommandError(f"cannot write {path}: {error.strerror or error}") from None
    with target:
        yield target
