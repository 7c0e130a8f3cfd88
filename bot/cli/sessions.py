"""`nodbot sessions revoke --principal NAME`: end every web inbox session of one person.

```
nodbot sessions revoke --principal ana@example.com -c nodbot.yml
```

The revocation is a row of the configuration's store, which every running bot on that store
checks on each request of the inbox, so it takes effect at once on every replica, without a
restart, and holds after one. Sessions signed in after it are not affected: send the person
a new sign-in link (`nodbot inbox-link`) when they may come back, or none when they may not.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from nodbot.bot.config import load_config
from nodbot.bot.store import store_for
from nodbot.core import ConfigurationError
from nodbot.core.store import utc_now

__all__ = ["add_sessions_commands", "run_sessions_command"]


def add_sessions_commands(commands: Any) -> None:
    """Add `sessions revoke` to the `nodbot` parser."""
    sessions = commands.add_parser(
        "sessions",
        help="end web inbox sessions",
        description="End the web inbox sessions of a reviewer, on every bot on the store.",
    )
    actions = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    revoke = actions.add_parser(
        "revoke",
        help="end every web inbox session of a person",
        description="End every web inbox session of PRINCIPAL signed in until now, on every "
        "bot that uses the configuration's store, at once and across restarts: their next "
        "request asks them to sign in again. The revocation is kept in the store for "
        "web.session_ttl, as long as those sessions could last. Sessions signed in later "
        "are not affected.",
    )
    revoke.add_argument(
        "--principal",
        required=True,
        metavar="NAME",
        help="who: the Slack user id or email address they signed in as (in any case)",
    )
    revoke.add_argument("-c", "--config", default="nodbot.yml", metavar="FILE", help="nodbot.yml")


async def run_sessions_command(arguments: argparse.Namespace) -> str:
    """Run one `sessions` command; returns what to print. Raises `NodbotError`s."""
    principal = arguments.principal.strip()
    if not principal:
        raise ConfigurationError("--principal names the reviewer whose sessions end")
    config = load_config(arguments.config)
    now = utc_now()
    async with store_for(config) as store:
        await store.sessions.revoke_principal(
            principal, until=now + timedelta(seconds=config.web.session_ttl), at=now
        )
        shown = store.display_url
    return f"ended every web inbox session of {principal} signed in until now (store {shown})"
