"""The core's two ports: where replicas live (the Runtime protocol, and what a replica host
shares whatever runs it) and where intent is kept (the Store protocol); and wrappers around both.
"""
