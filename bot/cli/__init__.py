"""The `nodbot` command: `commands` parses the command line and runs the bot's commands;
`approvals`, `audit`, `init`, `runs` and `sessions` are its command groups.

The command is the bot's: its packages come with `pip install 'nodbot[bot]'`. On the base
install (the engine and the client, for agents) `nodbot` says so in one line and exits 1,
instead of a traceback from the first import that fails."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["BOT_MODULES", "build_parser", "main"]

BOT_MODULES = frozenset(
    {
        *("starlette", "uvicorn", "httptools", "jinja2", "yaml"),
        *("slack_bolt", "slack_sdk", "websockets"),
        *("aiosmtpd", "aiosmtplib", "aioimaplib", "mailparser_reply"),
    }
)
"""The import names of the packages the `bot` extra adds to the base install."""

INSTALL = (
    "nodbot: the bot's packages are not installed (no module named {!r}); pip install 'nodbot[bot]'"
)


def _missing_bot_package(error: ModuleNotFoundError) -> bool:
    return (error.name or "").partition(".")[0] in BOT_MODULES


def main(argv: Sequence[str] | None = None) -> int:
    """`nodbot`: the console script's entry point (`nodbot.bot.cli:main`)."""
    try:
        from nodbot.bot.cli import commands
    except ModuleNotFoundError as error:
        if not _missing_bot_package(error):
            raise
        print(INSTALL.format(error.name), file=sys.stderr)
        return 1
    return commands.main(argv)


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser (`commands.build_parser`)."""
    from nodbot.bot.cli import commands

    return commands.build_parser()
