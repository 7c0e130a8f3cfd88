"""The bot's configuration: one YAML file (`nodbot.yml`) read into pydantic models.

```python
config = load_config("nodbot.yml")          # raises ConfigError listing every problem
problems = check_agents(config)             # imports the agents; [] when all is well
rule = config.first_matching_rule("refund", {"order_id": "A-1", "amount": 120.0})
```

Every problem is reported as `<file>:<line>: <dotted.key.path>: <message>`. String values
may name environment variables (`${SLACK_BOT_TOKEN}`, `${PORT:-8080}`; `$${` writes a
literal `${`), so secrets stay out of the file. Loading never imports an agent: that is
`check_agents`'s job.

The public API is what `__all__` lists; the modules behind it are private, each importing
only those listed before it: `errors` (problems and where they are in the file), `values`
(durations, reviewers, names), `predicates`, `models` (the file's sections), `reader`
(reading the YAML, `load_config`), `trust` (`trust_warnings`: secrets written in the file,
weak or repeated secrets, plain http beyond loopback) and `agents` (`load_agents`,
`check_agents`).
"""

from __future__ import annotations

from nodbot.bot.config.agents import check_agents, load_agents, load_framework_agents
from nodbot.bot.config.errors import ConfigError
from nodbot.bot.config.models import (
    ApiConfig,
    ApiScope,
    ApiToken,
    Config,
    EmailConfig,
    LogConfig,
    Rule,
    ServerConfig,
    SlackConfig,
    SmtpConfig,
    StoreConfig,
    WebConfig,
    Webhook,
    WebhookEvent,
    WorkersConfig,
)
from nodbot.bot.config.predicates import AllOf, AnyOf, PredicateSpec
from nodbot.bot.config.reader import load_config
from nodbot.bot.config.trust import trust_warnings, undecidable_warning, unread_replies_warning
from nodbot.bot.config.values import Reviewer, parse_duration, parse_reviewer

__all__ = [
    "AllOf",
    "AnyOf",
    "ApiConfig",
    "ApiScope",
    "ApiToken",
    "Config",
    "ConfigError",
    "EmailConfig",
    "LogConfig",
    "PredicateSpec",
    "Reviewer",
    "Rule",
    "ServerConfig",
    "SlackConfig",
    "SmtpConfig",
    "StoreConfig",
    "WebConfig",
    "Webhook",
    "WebhookEvent",
    "WorkersConfig",
    "check_agents",
    "load_agents",
    "load_config",
    "load_framework_agents",
    "parse_duration",
    "parse_reviewer",
    "trust_warnings",
    "undecidable_warning",
    "unread_replies_warning",
]
