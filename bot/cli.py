"""The `nodbot` command."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from core import NodbotError, SqlApprovalStore, __version__
from core.sqlstore import head_revision

DEFAULT_STORE = "sqlite:///nodbot.db"


def build_parser() -> argparse.ArgumentParser:
    """The command line: subcommands are added here as the bot grows."""
    parser = argparse.ArgumentParser(
        prog="nodbot",
        description="A self-hosted approval bot: risky tool calls wait for a person.",
    )
    parser.add_argument("--version", action="version", version=f"nodbot {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the approval store's schema",
        description="Create or upgrade the schema of the approval store's database.",
    )
    migrate.add_argument(
        "--store",
        default=DEFAULT_STORE,
        metavar="URL",
        help=f"sqlite:///path.db or postgresql://user@host/db (default: {DEFAULT_STORE})",
    )
    return parser


async def _migrate(url: str) -> str:
    store = SqlApprovalStore(url, auto_migrate=True)
    try:
        await store.open()
    finally:
        await store.close()
    return f"the database {store.display_url} is at schema revision {head_revision()}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.command is None:
        parser.print_help(sys.stdout)
        return 0
    try:
        print(asyncio.run(_migrate(arguments.store)))
    except NodbotError as error:
        print(f"nodbot: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
