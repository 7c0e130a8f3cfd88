"""The Microsoft Teams channel: review cards posted through the Bot Framework connector
(`channel`), and the actions on them taken at `POST /teams/messages` (`reviews`)."""
