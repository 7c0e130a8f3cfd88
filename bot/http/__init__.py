"""The bot's HTTP API: a Starlette application served by uvicorn.

```python
app = create_app(store=store, registry=registry, tokens=config.api.tokens)
```

Every request but `GET /healthz` carries `Authorization: Bearer <token>`; the token's name
is the principal recorded as `decided_by`. Every error answers `{"error", "details"}`.

The public API is what `__all__` lists; the modules behind it are private: `auth` (bearer
tokens, `ApiError`), `schemas` (the bodies and views) and `approvals` (the routes).
"""

from __future__ import annotations

from nodbot.bot.http.approvals import (
    SELF_APPROVAL_REASON,
    AuthorizeDecision,
    create_app,
    refuse_self_approval,
)

__all__ = ["SELF_APPROVAL_REASON", "AuthorizeDecision", "create_app", "refuse_self_approval"]
