"""``python -m hscapture`` is the ``hscapture`` command."""

from .cli import main

main()
