"""The email channel: review requests emailed to reviewers, with signed reply addresses."""
