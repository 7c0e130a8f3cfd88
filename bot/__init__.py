"""nodbot's bot: the configuration, the HTTP API and web inbox, Slack, email, and `nodbot serve`.

Its packages are an extra (`pip install 'nodbot[bot]'`); the engine and the client
(`nodbot.core`) need none of them.
"""

DOCS_URL = "https://docs.nodbot.dev/"
"""Where the docs site is published (`docs/`, built by `make docs`)."""
