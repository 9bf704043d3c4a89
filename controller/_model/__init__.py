"""The model: what a user asks for (configs, manifests), what is kept (checkpoint records,
revisions), what is shown (statuses), and the pure decisions made from them (reconcile,
autoscale, backoff, placement, the lease). No I/O and no trio, but for the code digest.
"""
