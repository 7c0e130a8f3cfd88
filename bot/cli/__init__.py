"""The `nodbot` command: `commands` parses the command line and runs the bot's commands;
`approvals`, `audit`, `init`, `runs` and `sessions` are its command groups."""

from nodbot.bot.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
