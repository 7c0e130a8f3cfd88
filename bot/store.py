"""The store a configuration names, opened the same way by every command."""

from __future__ import annotations

from nodbot.bot.config import Config
from nodbot.core import SqlApprovalStore

__all__ = ["store_for"]


def store_for(config: Config) -> SqlApprovalStore:
    """The store of `config`: its URL, whether it migrates, and the audit trail's key (every
    process that writes events must chain them with the same key)."""
    return SqlApprovalStore(
        config.store.url, auto_migrate=config.store.auto_migrate, audit_key=config.audit.secret
    )
