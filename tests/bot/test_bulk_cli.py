"""`nodbot approvals bulk approve|deny ID ...` as a subprocess against a configuration's
store, on SQLite and PostgreSQL: each review authorized by the rules and recorded on its own,
one line each, and the exit status saying whether every one was decided."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from nodbot.bot.bulk import MAX_ITEMS
from nodbot.bot.config import load_config
from nodbot.bot.http.schemas import BulkDecideView
from nodbot.bot.policy.authorize import NOT_A_REVIEWER
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, rules_executor
from nodbot.core import ApprovalEvent, SqlApprovalStore, ToolCall
from tests.bot.test_bulk_api import ARGUMENTS, registry
from tests.bot.test_cli import nodbot
from tests.core.store.conftest import database_url

ROOT = Path(__file__).resolve().parents[2]
SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
KEY = "the audit key of the bulk command"
LEAD = "U0123LEADS"
ANA = "U0456ANNA0"
CAROL = "carol@example.com"

CONFIG = """
store: {{url: "{url}"}}
audit: {{key: "${{NODBOT_AUDIT_KEY}}"}}
rules:
  - tool: refund
    reviewers: [U0123LEADS, U0456ANNA0]
  - tool: send_email
    reviewers: [U0456ANNA0]
  - tool: pay
    reviewers: [U0123LEADS, U0456ANNA0]
    approvals_required: 2
"""


class Shell:
    """A configuration file and its store, and reviews made pending by its rules."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.file = tmp_path / "nodbot.yml"
        self.file.write_text(CONFIG.format(url=url))
        self.url = url
        self.runs = itertools.count(1)

    async def pending(self, tool: str = "refund", *, requested_by: str = CAROL) -> str:
        config = load_config(self.file, environ={"NODBOT_AUDIT_KEY": KEY})
        async with SqlApprovalStore(self.url, audit_key=KEY) as store:
            executor = rules_executor(registry(), config, store)
            call = ToolCall(name=tool, arguments=ARGUMENTS[tool], id="c1")
            context = executor.context(f"run_{next(self.runs)}", requested_by=requested_by)
            result = await executor.run_call(call, context)
        assert result.error is not None, result
        return str(result.error.details["approval_id"])

    async def events(self, *ids: str) -> dict[str, list[ApprovalEvent]]:
        async with SqlApprovalStore(self.url, audit_key=KEY) as store:
            return {approval_id: await store.events(approval_id) for approval_id in ids}

    async def nodbot(self, *words: str) -> subprocess.CompletedProcess[str]:
        """`nodbot WORDS... --config FILE`, as a shell runs it."""
        command = [nodbot(), *words, "--config", str(self.file)]
        env = {**os.environ, "NODBOT_AUDIT_KEY": KEY}
        return await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, cwd=ROOT, timeout=60, env=env
        )

    async def bulk(self, *words: str) -> subprocess.CompletedProcess[str]:
        return await self.nodbot("approvals", "bulk", *words)


def lines(stdout: str) -> list[list[str]]:
    """Each item line as (id, outcome, why); the summary line last, whole."""
    found = stdout.splitlines()
    return [line.split(None, 2) for line in found[:-1]] + [[found[-1]]]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_mix_says_each_outcome_and_exits_1(backend: str, tmp_path: Path) -> None:
    async with database_url(backend, tmp_path) as url:
        shell = Shell(tmp_path, url)
        allowed = await shell.pending()
        own = await shell.pending(requested_by=LEAD)
        stranger = await shell.pending("send_email")
        earlier = await shell.pending()
        quorum = await shell.pending("pay")
        last = await shell.pending()
        first = await shell.bulk("deny", earlier, "--as", ANA, "--reason", "no")
        assert (first.returncode, first.stderr) == (0, "")
        before = (await shell.events(earlier))[earlier]
        unknown = "apr_unknown"

        done = await shell.bulk(
            "approve", allowed, own, stranger, earlier, unknown, quorum, last,
            "--as", LEAD, "--reason", "checked",
        )  # fmt: skip

        assert done.returncode == 1, done.stderr
        assert lines(done.stdout) == [
            [allowed, "decided", "approved"],
            [own, "refused", SELF_APPROVAL_REASON],
            [stranger, "refused", NOT_A_REVIEWER],
            [earlier, "already_decided", f"this approval was already decided by {ANA}"],
            [unknown, "not_found", "no approval has this id"],
            [quorum, "decided", "voted: 1 of 2 approvals, still pending"],
            [last, "decided", "approved"],
            ["7 reviews: 3 decided, 4 not decided"],
        ]
        events = await shell.events(allowed, own, stranger, earlier, quorum, last)
        assert events[earlier] == before
        for approval_id in (allowed, last):
            [decided] = [e for e in events[approval_id] if e.kind == "decided"]
            assert (decided.actor, decided.channel) == (LEAD, "cli")
            assert set(decided.detail["evidence"]) == {"os_user"}
            assert decided.detail["reason"] == "checked"
        assert [(e.kind, e.actor, e.channel) for e in events[quorum]][1:] == [
            ("voted", LEAD, "cli")
        ]
        for approval_id, reason in ((own, SELF_APPROVAL_REASON), (stranger, NOT_A_REVIEWER)):
            assert [(e.kind, e.actor, e.channel) for e in events[approval_id]][1:] == [
                ("refused", LEAD, "cli")
            ]
            assert events[approval_id][-1].detail["reason"] == reason

        audited = await shell.nodbot("audit", "verify")
    assert (audited.returncode, audited.stdout) == (0, "ok: 15 events in 6 reviews\n")


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_json_is_the_apis_document_and_all_decided_exits_0(
    backend: str, tmp_path: Path
) -> None:
    async with database_url(backend, tmp_path) as url:
        shell = Shell(tmp_path, url)
        ids = [await shell.pending(), await shell.pending("send_email"), await shell.pending()]
        done = await shell.bulk("deny", *ids, "--as", ANA, "--reason", "not now", "--json")
        assert (done.returncode, done.stderr) == (0, "")
        answer = BulkDecideView.model_validate_json(done.stdout)
        assert [(r.approval_id, r.status, r.error) for r in answer.results] == [
            (approval_id, "decided", None) for approval_id in ids
        ]
        assert (answer.decided, answer.not_decided) == (3, 0)
        for result in answer.results:
            assert result.approval is not None and result.approval.decision is not None
            assert result.approval.status == "denied"
            assert (result.approval.decision.decided_by, result.approval.decision.reason) == (
                ANA,
                "not now",
            )
        again = await shell.bulk("approve", ids[0], "--as", LEAD, "--json")
    assert again.returncode == 1
    [item] = BulkDecideView.model_validate_json(again.stdout).results
    assert (item.status, item.error) == (
        "already_decided",
        f"this approval was already decided by {ANA}",
    )


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["approve", "--as", LEAD], "the following arguments are required: ID"),
        (["edit", "{id}", "--as", LEAD], "invalid choice: 'edit'"),
        (["approve", "{id}", "{id}", "--as", LEAD], "'{id}' is listed twice"),
        (["approve", "{id}", "", "--as", LEAD], "item 1 is an empty id"),
        (
            ["approve", *(f"apr_{n}" for n in range(MAX_ITEMS + 1)), "--as", LEAD],
            f"{MAX_ITEMS + 1} reviews are listed; at most {MAX_ITEMS} are decided at once",
        ),
        (["deny", "{id}", "--as", LEAD, "--reason", "x" * 2001], "--reason"),
        (["approve", "{id}"], "the following arguments are required: --as"),
    ],
)
async def test_bad_input_exits_2_naming_it_and_records_nothing(
    tmp_path: Path, words: Sequence[str], said: str
) -> None:
    # Said before the store is opened: the same on every backend.
    async with database_url("sqlite", tmp_path) as url:
        shell = Shell(tmp_path, url)
        approval_id = await shell.pending()
        before = await shell.events(approval_id)
        done = await shell.bulk(*(word.replace("{id}", approval_id) for word in words))
        assert done.returncode == 2, done
        assert said.replace("{id}", approval_id) in done.stderr
        assert done.stderr.startswith("nodbot approvals bulk: error: ")
        assert done.stdout == ""
        assert await shell.events(approval_id) == before


def test_the_help_says_the_exit_statuses() -> None:
    done = subprocess.run(
        [nodbot(), "approvals", "bulk", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "0 every review listed was decided" in text
    assert "1 some were not" in text
    assert "2 a bad input" in text
    assert f"at most {MAX_ITEMS}" in text
