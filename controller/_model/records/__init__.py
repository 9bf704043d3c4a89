"""What the store keeps: specs' and revisions' records, checkpoints, what replicas report."""
