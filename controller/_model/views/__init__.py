"""What is shown: a backend's status, the watch snapshot's replicas, a load report."""
