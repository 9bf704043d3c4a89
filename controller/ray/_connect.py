"""Joining a Ray cluster, for the daemon (which must not import Ray itself)."""

from __future__ import annotations

import logging

import ray


def connect(address: str | None = None) -> None:
    """Connect this process to Ray once: `address` of a running cluster, or None for Ray's
    default (a running local cluster if there is one, else a new one)."""
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING)
