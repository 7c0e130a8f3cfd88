"""Drafts: new runs a store keeps in this process until their first save.

A run the bot starts has an id nobody else knows until the bot answers, so its first step
need not be written piecemeal: the run (`create_run`), each review its calls open (`claim`)
and the step's save (`save_run`) would be three write transactions. A draft is written once,
by its first save: the run as saved and its reviews, in one transaction. Until then no other
process sees it, nor its reviews; an operation of this process that names either (its run
id, one of its reviews' ids) writes the draft first, as it stands, and then finds it in the
database as if it had been written all along.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, TypeVar

from nodbot.core.outbox import Announcer
from nodbot.core.sqlstore.backend import Row, claim_step
from nodbot.core.store import ApprovalRequest

__all__ = ["Draft", "Drafts"]

T = TypeVar("T")
Claimed: TypeAlias = Literal["pending", "mismatch"]


@dataclass
class Draft:
    """A run not yet written: its row as `create_run` would insert it, and the rows of the
    pending reviews its step opened, in order."""

    run: Row
    reviews: list[Row] = field(default_factory=list)
    announcer: Announcer | None = None
    """Who announces the reviews when the first save writes them (`draft_run`)."""


class Drafts:
    """The drafts of one store, and the writes of them in progress."""

    def __init__(self) -> None:
        self._drafts: dict[str, Draft] = {}
        self._reviews: dict[str, str] = {}
        """A draft's review's approval id -> its run id."""
        self._writing: dict[str, asyncio.Future[None]] = {}

    def __bool__(self) -> bool:
        return bool(self._drafts) or bool(self._writing)

    def add(self, run: Row, announcer: Announcer | None = None) -> None:
        self._drafts[run["run_id"]] = Draft(run, announcer=announcer)

    def get(self, run_id: str) -> Draft | None:
        return self._drafts.get(run_id)

    def run_of(self, approval_id: str) -> str | None:
        """The run of a draft's review."""
        return self._reviews.get(approval_id)

    def claim(self, draft: Draft, request: ApprovalRequest, new: Row) -> tuple[Claimed, Row]:
        """A claim of a call of a draft's run: the call's review as the draft has it (it is
        pending: nobody can have decided it), or `new`, made its review."""
        for row in draft.reviews:
            if row["call_id"] == request.call_id:
                return ("mismatch" if claim_step(row, request) == "mismatch" else "pending"), row
        draft.reviews.append(new)
        self._reviews[new["approval_id"]] = draft.run["run_id"]
        return "pending", new

    async def write(self, run_id: str, writing: Callable[[Draft], Awaitable[T]]) -> T | None:
        """Take the draft of `run_id` out and `await writing(draft)`; if that fails, the draft
        is kept, to be written by the next operation that names it. None when there is no
        such draft: when another task is writing it, once that write has ended."""
        ongoing = self._writing.get(run_id)
        if ongoing is not None:
            await asyncio.shield(ongoing)
            return None
        draft = self._drafts.pop(run_id, None)
        if draft is None:
            return None
        done = self._writing[run_id] = asyncio.get_running_loop().create_future()
        try:
            written = await writing(draft)
        except BaseException:
            self._drafts[run_id] = draft
            raise
        else:
            for row in draft.reviews:
                self._reviews.pop(row["approval_id"], None)
            return written
        finally:
            del self._writing[run_id]
            done.set_result(None)

    def forget(self, run_id: str) -> None:
        """Drop a draft that will not be saved (its start was cancelled)."""
        draft = self._drafts.pop(run_id, None)
        for row in draft.reviews if draft is not None else ():
            self._reviews.pop(row["approval_id"], None)
