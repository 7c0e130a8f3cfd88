"""nodbot: a person between an AI agent's risky tool call and its effect.

The engine is `nodbot.core` (tools, rules, decisions, stores, the executor and the tool
loop, the approval client and the bridges), the bot `nodbot.bot` (configuration, the HTTP
API, the inbox, Slack, email, `nodbot serve`). `pip install nodbot` brings what the engine
imports; the bot's packages come with its extra, `pip install 'nodbot[bot]'`. The engine's
public names are here too: `from nodbot import Executor`.

In the repository, `nodbot/core` and `nodbot/bot` are links to the top-level `core/` and
`bot/` folders; an installed wheel holds them as plain folders under `nodbot/`, so nodbot
claims one import name in `site-packages`.
"""

from nodbot.core import *  # noqa: F403
from nodbot.core import __all__ as __all__
