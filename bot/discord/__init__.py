"""The Discord channel: reviews posted as messages with buttons, decided by clicks that
Discord sends to the interactions endpoint (`bot.discord.interactions`)."""
