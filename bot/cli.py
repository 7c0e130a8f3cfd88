"""The `nodbot` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from core import __version__


def build_parser() -> argparse.ArgumentParser:
    """The command line: subcommands are added here as the bot grows."""
    parser = argparse.ArgumentParser(
        prog="nodbot",
        description="A self-hosted approval bot: risky tool calls wait for a person.",
    )
    parser.add_argument("--version", action="version", version=f"nodbot {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help(sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
