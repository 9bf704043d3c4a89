"""The ``controller`` command: ``run`` starts the daemon; every other command talks to its API."""
