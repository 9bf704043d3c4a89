"""LocalRuntime: each replica a worker process on this machine, started by a fork server,
reached over a Unix socket, its output in a log file of its own.
"""
