"""Where a review is posted in each chat: a rule's `post_to` names places in Slack
(`#name`, `C...`, `dm`), Microsoft Teams (`teams:<name or id>` of `teams.post_to`) and
Discord (`discord:<channel id>`); each chat posts to its own places of the list, and nothing
when the list names none of them; a rule without `post_to` posts to each chat's default
places. `check-config` refuses a place the bot cannot post to, naming where it is."""

from __future__ import annotations

import textwrap
from pathlib import Path

import aiohttp
import pytest

from nodbot.bot.config import Config, ConfigError, load_config
from nodbot.bot.discord.channel import DiscordChannel
from nodbot.bot.policy.explain import explain
from nodbot.bot.slack.channel import SlackChannel
from nodbot.bot.teams.channel import TeamsChannel
from nodbot.core import ApprovalRequest, MemoryApprovalStore, ToolRegistry, arguments_digest

CHATS = """
slack: {bot_token: xoxb-test-0000000000, signing_secret: signing-secret-of-the-test-app}
teams:
  app_id: 00000000-0000-0000-0000-000000000001
  app_password: teams-password-of-the-test-bot-0000
  post_to:
    - {name: ops, conversation: "19:ops@thread.tacv2", service_url: "http://127.0.0.1:9/"}
    - {conversation: "a:1personal", service_url: "http://127.0.0.1:9/"}
discord:
  application_id: "123456789"
  public_key: "%s"
  bot_token: discord-token-of-the-test-bot-00000
  channels: ["111111111", "222222222"]
""" % ("ab" * 32)


def config(tmp_path: Path, rules: str, chats: str = CHATS) -> Config:
    path = tmp_path / "nodbot.yml"
    path.write_text(textwrap.dedent(chats) + "rules:\n" + textwrap.dedent(rules))
    return load_config(path)


def problems(tmp_path: Path, rules: str, chats: str = CHATS) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        config(tmp_path, rules, chats)
    return refused.value.problems


async def targets(found: Config, post_to: list[str] | None) -> dict[str, list[str]]:
    """The request deliveries each chat's channel wants for a review whose rule says
    `post_to`, by chat."""
    assert found.slack is not None and found.teams is not None and found.discord is not None
    store = MemoryApprovalStore()
    policy = {"reviewers": ["U0123LEADS", "#refunds"], "post_to": post_to}
    arguments = {"order_id": "o-1"}
    request = ApprovalRequest(
        "run_1", "call_1", "refund", arguments, arguments_digest(arguments), policy=policy
    )
    record = await store.create(request)
    registry = ToolRegistry()
    async with aiohttp.ClientSession() as session:  # never used: nothing is delivered
        channels = [
            SlackChannel(found.slack, store, registry, session=session),  # type: ignore[arg-type]
            TeamsChannel(found.teams, store, registry, session=session),  # type: ignore[arg-type]
            DiscordChannel(found.discord, store, registry, session=session),  # type: ignore[arg-type]
        ]
        return {
            channel.name: [d.target for d in channel.targets(record, "request")]
            for channel in channels
        }


async def test_a_rule_without_post_to_posts_to_each_chats_default_places(tmp_path: Path) -> None:
    found = config(tmp_path, "  - {tool: refund, reviewers: [U0123LEADS, '#refunds']}\n")
    assert await targets(found, None) == {
        "slack": ["slack:dm:U0123LEADS", "slack:channel:#refunds"],
        "teams": ["teams:19:ops@thread.tacv2", "teams:a:1personal"],
        "discord": ["discord:channel:111111111", "discord:channel:222222222"],
    }


async def test_post_to_names_the_places_of_every_chat_and_each_posts_to_its_own(
    tmp_path: Path,
) -> None:
    post_to = ["#ops", "teams:ops", "discord:333333333"]
    found = config(tmp_path, f"  - {{tool: refund, reviewers: [U0123LEADS], post_to: {post_to}}}\n")
    assert found.rules[0].post_to == post_to
    assert await targets(found, post_to) == {
        "slack": ["slack:channel:#ops"],
        "teams": ["teams:19:ops@thread.tacv2"],
        "discord": ["discord:channel:333333333"],
    }
    # A conversation by its id; a chat none of whose places is listed gets nothing.
    only_teams = ["teams:a:1personal", "teams:ops", "teams:ops"]
    assert await targets(found, only_teams) == {
        "slack": [],
        "teams": ["teams:a:1personal", "teams:19:ops@thread.tacv2"],
        "discord": [],
    }


async def test_explain_says_where_each_chat_posts(tmp_path: Path) -> None:
    found = config(
        tmp_path,
        "  - {tool: refund, reviewers: [U0123LEADS], post_to: [dm, 'discord:333333333']}\n",
    )
    plan = (await explain(found, "refund", {"order_id": "o-1"})).review
    assert plan is not None
    assert (plan.slack, plan.teams, plan.discord) == (["dm:U0123LEADS"], [], ["333333333"])


def test_a_place_the_bot_cannot_post_to_is_refused_naming_where(tmp_path: Path) -> None:
    unknown = problems(
        tmp_path, "  - {tool: refund, reviewers: [a@x.io], post_to: [teams:sales]}\n"
    )
    assert len(unknown) == 1
    assert "rules.0.post_to.0" in unknown[0]
    assert "no conversation of teams.post_to is named 'sales'" in unknown[0]
    assert "known: 19:ops@thread.tacv2, a:1personal, ops" in unknown[0]
    rule = (
        "  - {tool: refund, reviewers: [a@x.io], post_to: ['#ops', teams:ops, discord:1234567]}\n"
    )
    without = problems(tmp_path, rule, chats="")
    assert [p.split(": ", 1)[1] for p in without] == [
        "rules.0.post_to.1: no teams: section is configured",
        "rules.0.post_to.2: no discord: section is configured",
    ]
    for bad in ("discord:general", "teams:", "skype:ops"):
        [refused] = problems(
            tmp_path, f"  - {{tool: refund, reviewers: [a@x.io], post_to: ['{bad}']}}\n"
        )
        assert "rules.0.post_to.0" in refused and "expected a Slack channel" in refused


def test_a_teams_conversation_is_named_once(tmp_path: Path) -> None:
    chats = CHATS.replace('{conversation: "a:1personal"', '{name: ops, conversation: "a:1personal"')
    [refused] = problems(tmp_path, "  - {tool: refund, reviewers: [a@x.io]}\n", chats=chats)
    assert "teams.post_to.1" in refused and "'ops' names another conversation already" in refused
