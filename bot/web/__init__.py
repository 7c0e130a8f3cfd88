"""The web inbox: pages where reviewers sign in with a link and decide approvals.

```python
inbox = WebInbox(store=store, registry=registry, web=config.web, service=service)
app = create_app(store=store, registry=registry, tokens=..., inbox=inbox)
print(sign_in_link(config, "ana@example.com"))   # needs web.secret
```

The public API is what `__all__` lists; the modules behind it are private: `signing`
(links, sessions, form tokens), `app` (the routes and pages, rendered from `templates/web/`),
`listing` (the list's filters, search and pages), `live` (its live updates, server-sent
events), `arguments` (a review's arguments, long values folded), `history` (its events as
people and what they did), `questions` (a question to a person, shown as answered, declined
or timed out) and `slack_links` (links back to its Slack messages). The edit form
from a tool's schema is `bot.forms`, shared with Slack.
"""

from __future__ import annotations

from nodbot.bot.web.app import WebInbox
from nodbot.bot.web.signing import SignInLinkError, sign_in_link

__all__ = ["SignInLinkError", "WebInbox", "sign_in_link"]
