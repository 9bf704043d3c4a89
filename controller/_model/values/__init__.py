"""Plain values every kind of the model uses: errors, numbers, names, JSON, digests."""
