"""The Microsoft Teams channel: review cards and question cards (`questions`) posted through
the Bot Framework connector (`channel`), and the actions on them taken at `POST
/teams/messages` (`reviews`)."""
