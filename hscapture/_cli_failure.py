"""The command line's anticipated failures, rendered as one line ``hscapture: error: …``:
:class:`Failure` (exit 1) and :class:`Refusal` (exit 2: the input cannot produce what was
asked, nothing was written). Raised by every ``hscapture`` command; ``cli._Group`` adds the
traceback under ``--debug``. Its own module so that the commands defined outside
:mod:`hscapture.cli` (``cli_export``) use them without importing it back."""

from __future__ import annotations

from typing import Any

import click

__all__ = ["EXIT_ERROR", "EXIT_REFUSED", "Failure", "Refusal"]

EXIT_ERROR = 1
#: a refusal shares click's usage-error code: what was asked cannot be done with this input
EXIT_REFUSED = 2


class Failure(click.ClickException):
    """An anticipated failure: one line ``hscapture: error: …``, exit 1."""

    exit_code = EXIT_ERROR

    def show(self, file: Any = None) -> None:
        click.echo(f"hscapture: error: {self.format_message()}", err=True)


class Refusal(Failure):
    """The input cannot produce what was asked (nothing written): the same line, exit 2."""

    exit_code = EXIT_REFUSED
