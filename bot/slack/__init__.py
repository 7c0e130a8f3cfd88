"""The Slack channel: review requests posted with Approve / Edit / Deny, decisions taken from
the clicks and modals, and every message updated once the review is decided."""
