"""The stores of this machine: in memory, and a SQLite file (the embedded default)."""
