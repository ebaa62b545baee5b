"""Routing: the decision core shared by the router service and the gateway."""
