"""How the configuration reports problems: `ConfigError`, the problems validators raise
(each at a key path below the validated value), and `Source`, which knows the file and the
line of every key so a problem reads `<file>:<line>: <dotted.key.path>: <message>`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from pydantic_core import PydanticCustomError

from nodbot.core import ConfigurationError

KeyPath: TypeAlias = tuple[str | int, ...]
"""Where a value sits in the file: `("rules", 1, "timeout")` is `rules.1.timeout`."""


class ConfigError(ConfigurationError):
    """The configuration file cannot be used. `problems` lists every problem found, each as
    `<file>:<line>: <dotted.key.path>: <message>`; nothing was started or recorded."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems

    def details(self) -> dict[str, Any]:
        return {"problems": self.problems}


# --- problems raised inside validators ------------------------------------------------------


def problems(*found: tuple[KeyPath, str]) -> PydanticCustomError:
    """A validation error carrying several problems, each at a path below the validated value,
    so that the file's line of each can be reported."""
    message = "; ".join(text for _, text in found)
    return PydanticCustomError("nodbot", "{message}", {"message": message, "problems": found})


def problem(message: str, *at: str | int) -> PydanticCustomError:
    """One problem, at `at` below the validated value."""
    return problems((tuple(at), message))


# --- where things are in the file -----------------------------------------------------------


@dataclass
class Source:
    """The file a configuration came from, and the line of each key and list item in it."""

    file: str
    lines: dict[KeyPath, int]
    substituted: set[KeyPath] = field(default_factory=set)
    """Paths whose value came from the environment: their values are never shown."""
    from_environment: set[KeyPath] = field(default_factory=set)
    """Paths whose value holds a `${VAR}` read from a set environment variable."""
    defaulted: dict[KeyPath, list[str]] = field(default_factory=dict)
    """Paths whose value is written with a `${VAR:-default}`, used or not, with the names
    of those variables: the default is written in the file."""
    written: dict[KeyPath, str] = field(default_factory=dict)
    """The text of each value that holds a `${...}`, as the file writes it (never shown: a
    default may be a secret), so that which part of it comes from the environment can be
    told (the store URL's password)."""

    def line(self, path: KeyPath) -> int:
        """The line of `path`, or of its closest enclosing key when it is not in the file."""
        for end in range(len(path), -1, -1):
            found = self.lines.get(path[:end])
            if found is not None:
                return found
        return 1

    def locate(self, path: KeyPath, *, line: int | None = None) -> str:
        """`<file>:<line>: <dotted.path>`; `line` overrides the recorded one."""
        return f"{self.file}:{line or self.line(path)}: {dotted(path)}"

    def problem(self, path: KeyPath, message: str, *, line: int | None = None) -> str:
        """`<file>:<line>: <dotted.path>: <message>`."""
        return f"{self.locate(path, line=line)}: {message}"


def dotted(path: KeyPath) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


def shown(value: object) -> str:
    """A value as an error shows it: its type for containers, itself for scalars."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return repr(value)
