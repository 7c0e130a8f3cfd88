"""The Slack messages and modals: untrusted text made harmless, Block Kit's limits kept, and
the edit modal's inputs typed from the tool's schema."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from nodbot.bot.forms import edit_fields
from nodbot.bot.slack.messages import decided_message, deny_modal, edit_modal, request_message
from nodbot.bot.slack.text import code, escape
from nodbot.core import ApprovalRequest, Decision, ToolRegistry, arguments_digest
from nodbot.core.store import ApprovalRecord
from tests.fakes.slack import block_errors, view_errors

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def record(arguments: dict[str, Any], **policy: Any) -> ApprovalRecord:
    request = ApprovalRequest(
        "run_1",
        "c1",
        "ship",
        arguments,
        arguments_digest(arguments),
        "U0123ABCDE",
        NOW,
        policy=policy,
    )
    return ApprovalRecord("apr_1", request, created_at=NOW)


def test_escaping_leaves_no_mention_link_or_fence_working() -> None:
    assert escape("a & <!channel> <@U1|x> <https://e.x|y>") == (
        "a &amp; &lt;!channel&gt; &lt;@U1|x&gt; &lt;https://e.x|y&gt;"
    )
    block = code("```\n<!here>\n```", 3000)
    inner = block.removeprefix("```\n").removesuffix("\n```")
    assert "```" not in inner and "<" not in inner


def test_a_request_with_many_long_arguments_keeps_to_the_limits() -> None:
    arguments = {f"field_{i:02}": "<!here> " + "x" * 5000 for i in range(60)}
    rendered = request_message(
        record(arguments, description="<@U0999> " * 500),
        destructive=True,
        can_edit=True,
        allowed=["approve", "edit", "deny"],
    )
    assert rendered.cut
    assert len(rendered.blocks) <= 50
    assert block_errors(rendered.blocks) == []
    assert "<!here>" not in json.dumps(rendered.blocks)


def test_buttons_follow_the_rule() -> None:
    rendered = request_message(
        record({"to": "a"}), destructive=False, can_edit=False, allowed=["approve", "deny"]
    )
    [actions] = [b for b in rendered.blocks if b["type"] == "actions"]
    assert [e["action_id"] for e in actions["elements"]] == ["nodbot.approve", "nodbot.deny"]
    assert "confirm" not in actions["elements"][0]  # not destructive: no confirmation


def test_the_decided_message_has_no_buttons_and_says_who() -> None:
    decided = ApprovalRecord(
        "apr_1",
        record({"to": "a"}).request,
        created_at=NOW,
        decision=Decision(approved=False, reason="<!channel> no", decided_by="U0123ABCDE"),
        decided_at=NOW,
    )
    rendered = decided_message(decided)
    shown = json.dumps(rendered.blocks)
    assert "actions" not in shown and "<@U0123ABCDE>" in shown and "<!channel>" not in shown
    assert block_errors(rendered.blocks) == []


class Speed(Enum):
    SLOW = "slow"
    FAST = "fast"


def test_the_edit_modal_types_each_input_from_the_schema() -> None:
    tools = ToolRegistry()

    @tools.tool()
    def ship(
        count: int, weight: float, express: bool, speed: Speed, note: str, tags: list[str]
    ) -> str:
        """Ship."""
        return "ok"

    arguments = {
        "count": 2,
        "weight": 1.5,
        "express": True,
        "speed": "fast",
        "note": "<b>",
        "tags": ["a"],
    }
    schema = tools.get("ship").model.model_json_schema()
    view = edit_modal(record(arguments), edit_fields(schema, arguments, None))
    assert view_errors(view) == []
    elements = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    assert elements["arg.count"]["type"] == "number_input"
    assert elements["arg.count"]["is_decimal_allowed"] is False
    assert elements["arg.weight"]["is_decimal_allowed"] is True
    assert elements["arg.express"]["type"] == "static_select"
    assert elements["arg.express"]["initial_option"]["value"] == "true"
    assert [o["value"] for o in elements["arg.speed"]["options"]] == ['"slow"', '"fast"']
    assert elements["arg.note"] == {
        "type": "plain_text_input",
        "action_id": "value",
        "multiline": False,
        "initial_value": "<b>",
    }
    assert elements["arg.tags"]["multiline"] is True
    assert json.loads(elements["arg.tags"]["initial_value"]) == ["a"]
    assert view_errors(deny_modal(record(arguments))) == []
