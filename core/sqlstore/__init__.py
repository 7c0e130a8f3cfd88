"""The SQL approval store: SQLite (the embedded default) and PostgreSQL (several processes).

```python
store = SqlApprovalStore("sqlite:///nodbot.db")       # or postgresql://user@host/db
executor = Executor(registry, approval=DeferredApproval(store))
```
"""

from __future__ import annotations

from nodbot.core.sqlstore.migrate import MIGRATE_COMMAND, ensure_schema, head_revision
from nodbot.core.sqlstore.store import SqlApprovalStore

__all__ = ["MIGRATE_COMMAND", "SqlApprovalStore", "ensure_schema", "head_revision"]
