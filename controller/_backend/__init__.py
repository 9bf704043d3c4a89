"""One backend: its loop (a task and a nursery of its own), its replicas and their tasks, its
rollout, load and autoscaler, its intent written before it acts, and its view for others.
"""
