"""``python -m controller``: the same as the ``controller`` command."""

from ._cli import main

main()
