"""``python -m controller``: the same as the ``controller`` command."""

from ._cli.main import main

main()
