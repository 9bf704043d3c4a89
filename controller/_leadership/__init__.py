"""Daemons sharing one store: keeping the lease (the trio part; the pure part is the model's),
fencing what a leader writes, and a standby's view.
"""
