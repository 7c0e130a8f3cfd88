"""Who may decide a call: `rules` puts every call to the configuration's rules (the
approval port); `authorize` says whether a person may decide a review; `people` resolves
reviewers and handles; `bounds` checks a reviewer's edits; `remember` keeps approvals a
reviewer asked to remember."""

from nodbot.bot.policy.rules import rules_executor

__all__ = ["rules_executor"]
