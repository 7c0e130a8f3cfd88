"""Untrusted text made safe to show in Slack.

Tool arguments come from a model, so anything in them may be an attempt to ping a channel
(`<!channel>`, `<!here>`, `<@U123>`), to pass a link off as something else (`<https://x|y>`),
or to break out of a code block. Everything shown goes through `escape` (Slack's own three
escapes: `&`, `<`, `>`, which leave no control sequence intact), and argument values are shown
inside code blocks (`code`), where Slack makes no links or mentions, with any fence in the
value broken so that the block cannot be closed early. Lengths are cut to Block Kit's limits
(`clip`), saying how much was cut.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["FENCE", "clip", "code", "escape", "plain", "shown_value"]

FENCE = "```"
_ZERO_WIDTH = "\u200b"


def escape(text: str) -> str:
    """`text` with `&`, `<` and `>` escaped as Slack asks: no mention, link or special
    command in it is read as one."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def plain(text: str, limit: int) -> str:
    """`text` for a `plain_text` object (Slack shows it as is), cut to `limit` characters."""
    return clip(text, limit)


def clip(text: str, limit: int, *, marker: str = "…") -> str:
    """`text` cut to at most `limit` characters, ending in `marker` when cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(marker))] + marker


def code(text: str, limit: int) -> str:
    """`text` as a mrkdwn code block of at most `limit` characters, escaped, its fences
    broken (a zero-width space between the backticks) so that it cannot end the block."""
    body = escape(text).replace("`", "`" + _ZERO_WIDTH)
    room = limit - 2 * len(FENCE) - 2
    if len(body) > room:
        body = clip(body, room, marker=f"… ({len(text):,} characters in all)")
    return f"{FENCE}\n{body}\n{FENCE}"


def shown_value(value: Any) -> str:
    """An argument value as text: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=None, sort_keys=True)
