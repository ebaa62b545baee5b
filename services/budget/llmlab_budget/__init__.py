"""Budget service: identities and API keys, limits, atomic reserve → settle in Redis."""
