"""`nodbot approvals list|show|decide` against a configuration's store."""

from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodbot.bot.config import load_agents, load_config
from nodbot.bot.http.schemas import ApprovalView
from nodbot.bot.policy.rules import rules_executor
from nodbot.core import SqlApprovalStore, ToolCall
from tests.bot.test_cli import nodbot

ROOT = Path(__file__).resolve().parents[2]


def write_config(
    tmp_path: Path, rule: str = "reviewers: [U0123LEADS]\n    editable: [amount]"
) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}
agents:
  support: examples.support_agent:agent
rules:
  - tool: refund
    {rule}
"""
    )
    return path


async def pause_a_refund(config_file: Path) -> str:
    config = load_config(config_file)
    agents, _ = load_agents(config)
    async with SqlApprovalStore(config.store.url) as store:
        executor = rules_executor(agents["support"].tools, config, store)
        call = ToolCall(name="refund", arguments={"order_id": "A-1", "amount": 120}, id="c1")
        result = await executor.run_call(call, executor.context("run_cli", requested_by="carol"))
        assert result.error is not None
        return str(result.error.details["approval_id"])


def approvals(config_file: Path, *words: str) -> subprocess.CompletedProcess[str]:
    command = [nodbot(), "approvals", *words, "--config", str(config_file)]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.fixture
def paused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    monkeypatch.chdir(ROOT)
    config_file = write_config(tmp_path)
    return config_file, asyncio.run(pause_a_refund(config_file))


def test_list_and_show(paused: tuple[Path, str]) -> None:
    config_file, approval_id = paused
    listed = approvals(config_file, "list", "--status", "pending")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:4] == ["APPROVAL", "STATUS", "TOOL", "RUN"]
    assert row.split()[:4] == [approval_id, "pending", "refund", "run_cli"]
    shown = approvals(config_file, "show", approval_id)
    assert shown.stdout.splitlines()[0] == f"approval {approval_id} (pending)"
    assert 'refund {"amount": 120.0, "order_id": "A-1"}' in shown.stdout
    assert " created carol" in shown.stdout


def test_decide_is_allowed_by_the_rules_and_recorded(paused: tuple[Path, str]) -> None:
    config_file, approval_id = paused
    stranger = approvals(config_file, "decide", approval_id, "approve", "--as", "U0999OTHER")
    assert stranger.returncode == 1
    assert "you are not one of the reviewers of this call" in stranger.stderr
    invalid = approvals(
        config_file, "decide", approval_id, "edit", "--as", "U0123LEADS",
        "--arguments", '{"amount": "lots"}',
    )  # fmt: skip
    assert invalid.returncode == 2  # bad input
    assert "invalid edited arguments for tool 'refund'" in invalid.stderr
    decided = approvals(
        config_file, "decide", approval_id, "edit", "--as", "U0123LEADS",
        "--arguments", '{"amount": 100}',
    )  # fmt: skip
    assert decided.returncode == 0, decided.stderr
    assert decided.stdout.startswith(f"approval {approval_id} (approved by U0123LEADS)")
    shown = approvals(config_file, "show", approval_id)
    assert " voted U0123LEADS cli" in shown.stdout


def test_list_json_is_one_document_of_api_views(paused: tuple[Path, str]) -> None:
    config_file, approval_id = paused
    listed = approvals(config_file, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [item] = json.loads(listed.stdout)
    assert set(item) == set(ApprovalView.model_fields)
    view = ApprovalView.model_validate(item)
    assert (view.approval_id, view.status, view.run_id) == (approval_id, "pending", "run_cli")
    assert view.arguments == {"order_id": "A-1", "amount": 120.0}
    approvals(
        config_file, "decide", approval_id, "edit", "--as", "U0123LEADS",
        "--arguments", '{"amount": 100}',
    )  # fmt: skip
    [decided] = json.loads(approvals(config_file, "list", "--json").stdout)
    assert decided["decision"]["edited_args"] == {"amount": 100}
    assert decided["decision"]["decided_by"] == "U0123LEADS"


def test_list_and_show_give_the_edit_beside_the_original_and_who_decided(
    paused: tuple[Path, str],
) -> None:
    config_file, approval_id = paused
    decided = approvals(
        config_file, "decide", approval_id, "edit", "--as", "U0123LEADS",
        "--arguments", '{"amount": 100}',
    )  # fmt: skip
    assert decided.returncode == 0, decided.stderr
    header, row = approvals(config_file, "list").stdout.splitlines()
    assert "DECIDED BY" in header
    assert row.split()[:5] == [approval_id, "approved", "refund", "run_cli", "U0123LEADS"]
    assert row.endswith("edited: amount 120.0 → 100")
    shown = approvals(config_file, "show", approval_id).stdout
    assert "  edited: amount 120.0 → 100" in shown.splitlines()


def test_show_and_the_json_list_give_the_deadline_and_the_votes_so_far_and_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    rule = (
        "reviewers: [U0123LEADS, U0456OPSX]\n    approvals_required: 2\n"
        "    timeout: 30m\n    timeout_decision: approve"
    )
    config_file = write_config(tmp_path, rule)
    before = datetime.now(UTC)
    approval_id = asyncio.run(pause_a_refund(config_file))
    voted = approvals(config_file, "decide", approval_id, "approve", "--as", "U0123LEADS")
    assert voted.returncode == 0, voted.stderr
    shown = approvals(config_file, "show", approval_id).stdout.splitlines()
    [deadline_line] = [line for line in shown if line.startswith("  deadline ")]
    when = datetime.strptime(
        deadline_line.split()[1] + " " + deadline_line.split()[2], "%Y-%m-%d %H:%M:%S"
    )
    assert timedelta(minutes=29) <= when.replace(tzinfo=UTC) - before <= timedelta(minutes=31)
    assert deadline_line.endswith("UTC, then approved by nodbot:timeout if nobody decides")
    assert "  approvals 1 of 2 (U0123LEADS)" in shown
    [item] = json.loads(approvals(config_file, "list", "--json").stdout)
    assert (item["approvals"], item["approvals_required"]) == (1, 2)
    assert item["timeout_decision"] == "approve" and item["deadline"].startswith(f"{when:%Y-%m-%d}")


def test_show_says_when_a_review_has_no_deadline(paused: tuple[Path, str]) -> None:
    config_file, approval_id = paused
    shown = approvals(config_file, "show", approval_id).stdout.splitlines()
    assert "  no deadline: it waits until someone decides" in shown
    assert "  approvals 0 of 1" in shown
