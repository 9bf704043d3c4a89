"""Pure decisions: a spec's target, a pass's plan, the autoscaler, a canary's moves, backoff."""
