"""``controller run``: the daemon, its state dir, its roles (standby, leader) and its ingress
processes.
"""
