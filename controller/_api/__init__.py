"""The daemon's HTTP API (an ASGI app), its OpenAPI description, the console's server side and
the metrics it serves.
"""
