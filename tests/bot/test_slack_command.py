"""The `/nodbot` slash command end to end: the real bot (`serving`), the real slack_bolt code,
the local fake of Slack, commands sent to `/slack/events` form-encoded and signed as Slack
sends them, and their answers read where Slack shows them (the command's response URL, an
ephemeral message to its user). Also the parsing of the command's text, whatever it is."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodbot.bot.policy.authorize import NOT_A_REVIEWER
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON
from nodbot.bot.slack.commands import MAX_TEXT, Command, CommandError, parse
from nodbot.bot.slack.home import ACTION_HOME_APPROVE
from tests.bot.test_slack import Bot
from tests.bot.test_slack_home import PUBLIC, events_of, home_bot, review
from tests.fakes.slack import CommandSent, Ephemeral, User, command_request


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with home_bot(tmp_path, monkeypatch) as running:
        yield running


async def command(bot: Bot, user: User, text: str) -> tuple[CommandSent, Ephemeral]:
    """`user` types `/nodbot text`; the command and the one answer shown to them."""
    before = len(bot.slack.ephemerals)
    sent = await bot.slack.send_command(user, text)
    assert (sent.status, sent.body) == (200, ""), sent  # acknowledged at once, empty
    [response] = await bot.slack.wait_for_responses(sent, within=10)
    assert response.body.get("response_type") == "ephemeral"
    [shown] = bot.slack.ephemerals[before:]
    assert shown.user == user.id
    return sent, shown


async def unchanged(bot: Bot, approval_id: str) -> None:
    """Nothing decided, voted or refused on the review."""
    assert (await bot.record(approval_id)).decision is None
    assert [kind for kind, _, _ in await events_of(bot, approval_id)] == ["created"]


async def test_pending_lists_the_callers_reviews_to_them_alone(bot: Bot) -> None:
    refund = await review(bot)
    email = await review(bot, "send_email")
    newest = await review(bot, order_id="A-2", amount=300)
    _, shown = await command(bot, bot.lead, "pending")
    assert shown.text.startswith("2 reviews wait for your decision")
    texts = [block["text"]["text"] for block in shown.blocks if block["type"] == "section"]
    assert newest in texts[1] and refund in texts[2] and len(texts) == 3
    assert email not in str(shown.blocks)
    assert f"<{PUBLIC}/inbox/approvals/{newest}|Open in inbox>" in texts[1]
    _, theirs = await command(bot, bot.other, "pending")
    assert email in str(theirs.blocks) and refund not in str(theirs.blocks)
    _, nothing = await command(bot, bot.carol, "  PENDING ")
    assert nothing.text == "Nothing waits for your decision."
    for approval_id in (refund, email, newest):
        await unchanged(bot, approval_id)


async def test_approve_by_command_decides_as_a_click_would(bot: Bot) -> None:
    email = await review(bot, "send_email")
    _, shown = await command(bot, bot.other, f"approve {email}")
    assert shown.text == f"Approved: *send_email* (review `{email}`)."
    record = await bot.decided(email)
    assert record.decision is not None and record.decision.approved
    assert record.decision.decided_by == bot.other.id
    [(kind, actor, evidence)] = [e for e in await events_of(bot, email) if e[0] == "decided"]
    assert (kind, actor) == ("decided", bot.other.id)
    assert evidence["via"] == "slash command" and evidence["user"] == bot.other.id
    assert evidence["channel"] == bot.slack.open_dm(bot.other).id
    assert ("decided", bot.other.id, "slack") in await bot.events(email)
    # Decided already: said so, and the decision stays as it was.
    _, again = await command(bot, bot.other, f"approve {email}")
    assert "already decided" in again.text
    assert [kind for kind, _, _ in await events_of(bot, email)].count("decided") == 1
    assert (await bot.record(email)).decision == record.decision


async def test_a_destructive_tool_is_approved_by_command_only_once_confirmed(bot: Bot) -> None:
    refund = await review(bot)
    _, shown = await command(bot, bot.lead, f"approve {refund}")
    assert "Nothing is approved yet" in shown.text
    _, button = shown.action(ACTION_HOME_APPROVE)
    assert button["value"] == refund and "confirm" in button
    await unchanged(bot, refund)
    answer = await bot.send(bot.slack.ephemeral_click(shown, ACTION_HOME_APPROVE))
    assert answer.status_code == 200
    record = await bot.decided(refund)
    assert record.decision is not None and record.decision.decided_by == bot.lead.id
    [evidence] = [e for kind, _, e in await events_of(bot, refund) if kind == "decided"]
    assert evidence["via"] == "slash command"
    await bot.slack.wait_for_responses(shown, within=10)
    assert shown.text == f"Approved: *refund* (review `{refund}`)." and shown.blocks == []


async def test_a_non_reviewers_approve_is_refused_recorded_and_answered(bot: Bot) -> None:
    refund = await review(bot)
    for user, reason in ((bot.other, NOT_A_REVIEWER), (bot.carol, SELF_APPROVAL_REASON)):
        _, shown = await command(bot, user, f"approve {refund}")
        assert shown.text.startswith(f"Nothing was decided on *refund* (review `{refund}`)")
        assert reason.rstrip(".") in shown.text
        assert shown.blocks == []  # no button to confirm: there is nothing to confirm
    events = await bot.served.service.store.events(refund)
    assert [
        (e.actor, e.detail.get("reason"), e.detail.get("evidence", {}).get("via"))
        for e in events
        if e.kind == "refused"
    ] == [
        (bot.other.id, NOT_A_REVIEWER, "slash command"),
        (bot.carol.id, SELF_APPROVAL_REASON, "slash command"),
    ]
    assert (await bot.record(refund)).decision is None


async def test_deny_by_command_with_a_reason(bot: Bot) -> None:
    refund = await review(bot)
    reason = "no receipt <!channel>\nnot this month"
    _, shown = await command(bot, bot.second, f"deny {refund} {reason}")
    assert shown.text == f"Denied: *refund* (review `{refund}`)."
    record = await bot.decided(refund)
    assert record.decision is not None and not record.decision.approved
    assert (record.decision.reason, record.decision.decided_by) == (reason, bot.second.id)


async def test_an_unknown_id_and_bad_text_are_answered_and_change_nothing(bot: Bot) -> None:
    refund = await review(bot)
    _, unknown = await command(bot, bot.lead, "approve apr_0000000000000000000000000000")
    assert "no review has the id `apr_0000000000000000000000000000`" in unknown.text
    wrong = {
        "approve": "`approve` needs the whole id of a review",
        "deny": "`deny` needs the whole id of a review",
        "approve <!here>": "“&lt;!here&gt;” is not a review id",
        f"approve {refund} now": "`approve` takes only the review's id",
        "pending please": "`pending` takes nothing after it",
        "frobnicate <@U0123ABCDE>": "there is no command “frobnicate”",
        f"deny {refund} {'x' * 2001}": "the reason has 2001 characters; at most 2000",
        "x" * (MAX_TEXT + 1): f"the command has {MAX_TEXT + 1:,} characters",
    }
    for text, said in wrong.items():
        _, shown = await command(bot, bot.lead, text)
        assert shown.text.startswith("That did not work: "), shown.text
        assert said in shown.text, (text, shown.text)
        assert "*/nodbot pending*" in shown.text  # and how to use it
        assert "<!here>" not in shown.text and "<@U0123ABCDE>" not in shown.text
    await unchanged(bot, refund)


async def test_help_says_how_to_use_it(bot: Bot) -> None:
    for text in ("", "help", "HELP me"):
        _, shown = await command(bot, bot.carol, text)
        assert "*/nodbot approve <id>*" in shown.text and "whole id" in shown.text
        assert "That did not work" not in shown.text


@pytest.mark.parametrize("tamper", ["signature", "stale", "body"])
async def test_a_command_not_signed_by_slack_is_refused_and_changes_nothing(
    bot: Bot, tamper: str
) -> None:
    refund = await review(bot)
    payload = bot.slack.slash_command(bot.lead, f"deny {refund} forged")
    if tamper == "signature":
        sent = await bot.slack.send_command(payload=payload, secret="another-signing-secret")
    elif tamper == "stale":
        sent = await bot.slack.send_command(payload=payload, timestamp=int(time.time()) - 600)
    else:  # signed, then changed on the way
        body, headers = command_request(payload, bot.slack.signing_secret)
        changed = body.replace(b"deny", b"approve")
        answer = await bot.client.post("/slack/events", content=changed, headers=headers)
        sent = CommandSent(payload, "http", answer.status_code, answer.text)
    assert sent.status == 401
    assert bot.slack.responses(sent) == [] and bot.slack.ephemerals == []
    await unchanged(bot, refund)


async def test_a_command_over_socket_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with home_bot(tmp_path, monkeypatch, socket=True) as bot:
        email = await review(bot, "send_email")
        sent = await bot.slack.send_command(bot.other, f"approve {email}")
        assert sent.via == "socket" and sent.ack is not None
        [response] = await bot.slack.wait_for_responses(sent, within=10)
        assert response.body["text"] == f"Approved: *send_email* (review `{email}`)."
        record = await bot.decided(email)
        assert record.decision is not None and record.decision.decided_by == bot.other.id


# --------------------------------------------------------------------------------------------
# The command's text


def test_the_commands_text_is_read_as_documented() -> None:
    approval = "apr_0123456789abcdef0123456789ab"
    assert parse("") == parse("help") == parse(" Help ") == Command("help")
    assert parse("pending") == parse("\tPENDING\n") == Command("pending")
    assert parse(f"approve {approval}") == Command("approve", approval)
    assert parse(f"deny  {approval}") == Command("deny", approval)
    assert parse(f"DENY {approval}  too  much\nmoney ") == Command(
        "deny", approval, "too  much\nmoney"
    )
    for bad in ("approve", f"approve {approval} x", "approve a.b", "pending x", "yes"):
        with pytest.raises(CommandError):
            parse(bad)


@given(st.text(max_size=MAX_TEXT + 50))
def test_any_text_is_a_command_or_says_what_is_wrong(text: str) -> None:
    asked: Command | None = None
    try:
        asked = parse(text)
    except CommandError as exc:
        problem = str(exc)
    if asked is None:
        assert problem  # says what is wrong
        return
    assert asked.verb in ("help", "pending", "approve", "deny")
    if asked.verb in ("approve", "deny"):
        assert asked.approval_id is not None and asked.approval_id in text
        assert len(asked.approval_id) <= 100
    if asked.reason is not None:
        assert asked.verb == "deny" and 0 < len(asked.reason) <= 2000
