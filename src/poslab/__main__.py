"""``python -m poslab``: the command line of :mod:`poslab.cli`."""

from poslab.cli import main

main()
