"""Router: deployment and replica choice (domain in this package; transport in transport.py)."""
