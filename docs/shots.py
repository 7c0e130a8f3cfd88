"""The Quick start's screenshots, made from a real bot: `python docs/shots.py [out_dir]`
writes inbox.png and slack-review.png to out_dir (by default docs/img/, where they are kept).

It serves nodbot on SQLite with the example support agent, as `make demo` does, with its
Slack channel pointed at the local stand-in of Slack's Web API that the tests use
(tests/fakes/slack.py), and starts a run whose refund of 120.0 waits for a review. Then:

- inbox.png: a reviewer signs in to the web inbox with a sign-in link, in headless Chromium,
  and the inbox with the pending review is captured;
- slack-review.png: the blocks the bot posted to Slack for that review (what chat.postMessage
  received) are drawn as HTML in Slack's look (`slack_html`: header, section, fields,
  context, buttons, mrkdwn) and captured the same way.

Chromium is Debian's (`/usr/bin/chromium`, or the one `NODBOT_TEST_CHROMIUM` names); it
resolves no host name but loopback ones, so nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples.support_agent and tests.fakes.slack

from nodbot.bot.serve import serving  # noqa: E402
from tests.fakes.slack import SlackFake, slack_fake  # noqa: E402

INBOX_SIZE = (1100, 420)
"""The inbox screenshot's width and height, in CSS pixels (one image pixel each)."""
SLACK_SIZE = (760, 470)
"""The Slack message screenshot's width and height."""
REVIEWER = "lead@example.com"
CHANNEL = "refund-approvals"
WAIT = 60.0
"""Seconds the bot, its Slack post and each screenshot may take on a busy machine."""

CONFIG = """\
store: {{url: "sqlite:///{folder}/nodbot.db"}}
server: {{host: 127.0.0.1, port: 0}}
web:
  secret: ${{NODBOT_SHOTS_WEB_SECRET}}
api:
  tokens:
    - name: support-desk
      token: ${{NODBOT_SHOTS_TOKEN}}
      scopes: [runs:write]
agents:
  support: examples.support_agent:agent
slack:
  bot_token: ${{NODBOT_SHOTS_SLACK_BOT_TOKEN}}
  signing_secret: ${{NODBOT_SHOTS_SLACK_SIGNING_SECRET}}
  api_url: {api_url}
rules:
  - tool: refund
    when: {{gt: {{amount: 100}}}}
    description: Refunds over 100 need a support lead.
    reviewers: [{reviewer}]
    post_to: [{channel}]
    editable: [amount]
    timeout: 4h
"""

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # run as root in containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
)


def chromium() -> str:
    """The browser to run. Raises `SystemExit` saying what to install when there is none."""
    path = os.environ.get("NODBOT_TEST_CHROMIUM") or shutil.which("chromium")
    path = path or "/usr/bin/chromium"
    if not Path(path).exists():
        raise SystemExit(f"docs/shots.py: no Chromium at {path}: apt-get install chromium")
    return path


async def screenshot(url: str, out: Path, size: tuple[int, int], profile: Path) -> Path:
    """`url` as headless Chromium draws it in a window of `size`, saved as the PNG `out`.
    Run as a subprocess of this event loop, so that the bot in it keeps answering."""
    process = await asyncio.create_subprocess_exec(
        chromium(),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
        f"--screenshot={out}",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, said = await asyncio.wait_for(process.communicate(), WAIT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise SystemExit(f"docs/shots.py: Chromium took over {WAIT:.0f} s on {url}") from None
    if process.returncode != 0 or not _written(out):
        tail = said.decode(errors="replace").strip().splitlines()[-5:]
        raise SystemExit(f"docs/shots.py: Chromium made no screenshot of {url}: {tail}")
    return out


def _written(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


# -- Slack's look -----------------------------------------------------------------------------

_CODE_BLOCK = re.compile(r"\n?```\n?(.*?)\n?```\n?", re.DOTALL)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_CONTROL = re.compile(r"<([^<>]*)>")
_STYLES = (
    (re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])"), "b"),
    (re.compile(r"(?<![\w_])_(?=\S)([^_\n]+?)(?<=\S)_(?![\w_])"), "i"),
    (re.compile(r"(?<![\w~])~(?=\S)([^~\n]+?)(?<=\S)~(?![\w~])"), "s"),
)
_ZERO_WIDTH = "\u200b"


def _unescape(text: str) -> str:
    """Slack's three escapes undone (the text is escaped again for HTML after)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _date(control: str, now: datetime) -> str:
    """`!date^<seconds>^<format>|<fallback>` as Slack shows it to a reader."""
    spec, _, fallback = control.partition("|")
    parts = spec.split("^")
    try:
        moment = datetime.fromtimestamp(int(parts[1])).astimezone()
    except (IndexError, ValueError, OverflowError, OSError):
        return fallback
    day = moment.date()
    pretty = (
        "today"
        if day == now.date()
        else "tomorrow"
        if (day - now.date()).days == 1
        else moment.strftime("%B %d").replace(" 0", " ")
    )
    tokens = {
        "date_short_pretty": pretty.capitalize(),
        "date_short": moment.strftime("%b %d").replace(" 0", " "),
        "date": moment.strftime("%B %d, %Y").replace(" 0", " "),
        "time": moment.strftime("%I:%M %p").lstrip("0"),
        "time_secs": moment.strftime("%I:%M:%S %p").lstrip("0"),
    }
    fmt = parts[2] if len(parts) > 2 else ""
    shown = re.sub(r"\{(\w+)\}", lambda m: tokens.get(m.group(1), m.group(0)), fmt)
    return shown if "{" not in shown else fallback


def _control(inner: str, users: Mapping[str, str], now: datetime) -> str:
    """A `<...>` of mrkdwn as Slack shows it: a mention, a channel, a date or a link."""
    target, _, label = inner.partition("|")
    if target.startswith("@"):
        name = users.get(target[1:], target[1:])
        return f'<span class="mention">@{html.escape(_unescape(name))}</span>'
    if target.startswith("#"):
        name = label or target[1:]
        return f'<span class="mention">#{html.escape(_unescape(name))}</span>'
    if target.startswith("!date^"):
        return html.escape(_unescape(_date(inner, now)))
    if target.startswith("!"):
        return f'<span class="mention">@{html.escape(_unescape(target[1:]))}</span>'
    return f'<span class="link">{html.escape(_unescape(label or target))}</span>'


def _text(text: str, users: Mapping[str, str], now: datetime) -> str:
    """Plain mrkdwn (no code) as HTML: controls, bold, italic, strike, line breaks."""
    out = []
    for index, part in enumerate(_CONTROL.split(text)):
        if index % 2:
            out.append(_control(part, users, now))
            continue
        shown = html.escape(_unescape(part))
        for pattern, tag in _STYLES:
            shown = pattern.sub(rf"<{tag}>\1</{tag}>", shown)
        out.append(shown)
    return "".join(out).replace("\n", "<br>")


def mrkdwn(text: str, users: Mapping[str, str], now: datetime) -> str:
    """Slack's mrkdwn as HTML: code blocks, inline code, then the rest (`_text`); every
    character of the text escaped for HTML."""
    out = []
    for index, part in enumerate(_CODE_BLOCK.split(text)):
        if index % 2:
            body = html.escape(_unescape(part).replace(_ZERO_WIDTH, ""))
            out.append(f'<pre class="code">{body}</pre>')
            continue
        for inner, piece in enumerate(_INLINE_CODE.split(part)):
            if inner % 2:
                out.append(f"<code>{html.escape(_unescape(piece))}</code>")
            else:
                out.append(_text(piece, users, now))
    return "".join(out)


def _object(text: Mapping[str, Any], users: Mapping[str, str], now: datetime) -> str:
    """A text object: mrkdwn drawn, plain_text shown as written."""
    if text.get("type") == "mrkdwn":
        return mrkdwn(str(text.get("text", "")), users, now)
    return html.escape(str(text.get("text", ""))).replace("\n", "<br>")


def _block(block: Mapping[str, Any], users: Mapping[str, str], now: datetime) -> str:
    kind = block.get("type")
    if kind == "header":
        return f'<div class="header">{_object(block["text"], users, now)}</div>'
    if kind == "divider":
        return '<hr class="divider">'
    if kind == "section":
        parts = []
        if "text" in block:
            parts.append(f'<div class="text">{_object(block["text"], users, now)}</div>')
        if block.get("fields"):
            fields = "".join(
                f'<div class="field">{_object(item, users, now)}</div>' for item in block["fields"]
            )
            parts.append(f'<div class="fields">{fields}</div>')
        return f'<div class="section">{"".join(parts)}</div>'
    if kind == "context":
        items = "".join(
            f"<span>{_object(item, users, now)}</span>" for item in block.get("elements", [])
        )
        return f'<div class="context">{items}</div>'
    if kind == "actions":
        buttons = []
        for element in block.get("elements", []):
            if element.get("type") != "button":
                raise ValueError(f"slack_html draws buttons only, not {element.get('type')!r}")
            style = element.get("style")
            css = f"button {style}" if style in ("primary", "danger") else "button"
            label = html.escape(str(element["text"]["text"]))
            buttons.append(f'<span class="{css}">{label}</span>')
        return f'<div class="actions">{"".join(buttons)}</div>'
    # Faithful or nothing: a block it cannot draw stops the script instead of vanishing.
    raise ValueError(f"slack_html cannot draw a {kind!r} block")


SLACK_CSS = """
  body { margin: 0; background: #fff; color: #1d1c1d;
         font: 15px/1.46668 Lato, "Helvetica Neue", "Liberation Sans", Arial, sans-serif; }
  .channel { padding: 14px 20px; border-bottom: 1px solid #e2e2e2; font-weight: 900;
             font-size: 18px; }
  .channel .hash { color: #616061; font-weight: 400; margin-right: 2px; }
  .message { display: flex; gap: 8px; padding: 12px 20px; }
  .avatar { flex: none; width: 36px; height: 36px; border-radius: 6px; background: #1d232a;
            color: #fff; font-weight: 900; font-size: 20px; text-align: center;
            line-height: 36px; }
  .body { flex: 1; min-width: 0; }
  .who { font-weight: 900; }
  .app { font-size: 10px; font-weight: 700; color: #616061; background: #e8e8e8;
         border-radius: 2px; padding: 1px 3px; margin: 0 4px; vertical-align: 2px; }
  .when { color: #616061; font-size: 12px; }
  .header { font-size: 18px; font-weight: 900; margin: 6px 0 2px; }
  .section { margin: 8px 0; }
  .fields { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 16px; }
  .context { color: #616061; font-size: 13px; margin: 6px 0; }
  .actions { display: flex; gap: 8px; margin: 12px 0 4px; flex-wrap: wrap; }
  .button { border: 1px solid #bbb; border-radius: 4px; padding: 0 12px; height: 28px;
            line-height: 28px; font-size: 13px; font-weight: 700; background: #fff; }
  .button.primary { background: #007a5a; border-color: #007a5a; color: #fff; }
  .button.danger { background: #e01e5a; border-color: #e01e5a; color: #fff; }
  code { font: 12px Monaco, Menlo, Consolas, "DejaVu Sans Mono", monospace; color: #c01343;
         background: #f6f6f6; border: 1px solid #ddd; border-radius: 3px; padding: 2px 3px; }
  pre.code { font: 12px/1.5 Monaco, Menlo, Consolas, "DejaVu Sans Mono", monospace;
             background: #f8f8f8; border: 1px solid #ddd; border-radius: 4px; padding: 8px;
             margin: 4px 0 0; white-space: pre-wrap; overflow-wrap: anywhere; }
  .mention { color: #1264a3; background: #e8f5fa; border-radius: 3px; padding: 0 2px; }
  .link { color: #1264a3; }
"""


def slack_html(
    blocks: list[dict[str, Any]],
    *,
    channel: str,
    users: Mapping[str, str],
    posted: datetime,
) -> str:
    """A page showing one message of the bot in a channel as Slack draws it: its blocks,
    every text escaped. Raises `ValueError` for a block or element it cannot draw."""
    drawn = "".join(_block(block, users, posted) for block in blocks)
    when = posted.strftime("%I:%M %p").lstrip("0")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>#{html.escape(channel)}</title><style>{SLACK_CSS}</style></head><body>"
        f'<div class="channel"><span class="hash">#</span>{html.escape(channel)}</div>'
        '<div class="message"><div class="avatar">n</div><div class="body">'
        f'<div><span class="who">nodbot</span><span class="app">APP</span>'
        f'<span class="when">{html.escape(when)}</span></div>{drawn}</div></div>'
        "</body></html>\n"
    )


# -- the bot ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def pending_review(folder: Path) -> AsyncIterator[tuple[str, SlackFake, str]]:
    """A bot with a review waiting: (its inbox sign-in link for `REVIEWER`, the Slack fake
    it posted to, the channel's id), until the block ends."""
    os.environ["NODBOT_SHOTS_TOKEN"] = token = secrets.token_urlsafe(32)
    os.environ["NODBOT_SHOTS_WEB_SECRET"] = secrets.token_urlsafe(32)
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email=REVIEWER, real_name="Support Lead")
        channel = slack.add_channel(CHANNEL, [lead])
        os.environ["NODBOT_SHOTS_SLACK_BOT_TOKEN"] = slack.bot_token
        os.environ["NODBOT_SHOTS_SLACK_SIGNING_SECRET"] = slack.signing_secret
        config = folder / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                folder=folder,
                api_url=slack.api_url,
                reviewer=REVIEWER,
                channel=channel.id,
            )
        )
        async with serving(str(config)) as bot, httpx.AsyncClient(base_url=bot.url) as client:
            body = {"agent": "support", "input": "Refund order A-1001"}
            headers = {"Authorization": f"Bearer {token}"}
            answer = await client.post("/runs", json=body, headers=headers, timeout=WAIT)
            answer.raise_for_status()
            await slack.wait_until(
                lambda: bool(slack.messages(channel)), WAIT, "the review's Slack message"
            )
            yield bot.sign_in_link(REVIEWER), slack, channel.id


async def make(out: Path) -> list[Path]:
    """Write inbox.png and slack-review.png to `out`, a folder; returns their paths."""
    with tempfile.TemporaryDirectory(prefix="nodbot-shots-") as name:
        folder = Path(name)
        async with pending_review(folder) as (link, slack, channel):
            inbox = await screenshot(link, out / "inbox.png", INBOX_SIZE, folder / "chromium")
            [message] = slack.messages(channel)
            users = {user.id: user.real_name for user in slack.users.values()}
            posted = datetime.fromtimestamp(float(message.ts)).astimezone()
        page = folder / "slack-review.html"
        page.write_text(slack_html(message.blocks, channel=CHANNEL, users=users, posted=posted))
        review = await screenshot(
            page.as_uri(), out / "slack-review.png", SLACK_SIZE, folder / "chromium"
        )
    return [inbox, review]


def main() -> None:
    out = (Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img").resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # where the configuration's examples.support_agent is imported from
    for path in asyncio.run(make(out)):
        print(f"docs/shots.py: wrote {path}")


if __name__ == "__main__":
    main()
