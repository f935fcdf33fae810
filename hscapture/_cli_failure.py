"""The command line's anticipated failures, rendered as one line ``hscapture: error: …``:
:class:`Failure` (exit 1) and :class:`Refusal` (exit 2: the input cannot produce what was
asked, nothing was written). Raised by every ``hscapture`` command; ``cli._Group`` adds the
traceback under ``--debug``. Its own module so that the commands defined outside
:mod:`hscapture.cli` (``cli_export``) use them without importing it back."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import click

from .errors import HSCaptureError

__all__ = ["EXIT_ERROR", "EXIT_REFUSED", "Failure", "Refusal", "describe", "json_error_too"]

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


#: a remedy the library words for both audiences, ``overwrite=True (--overwrite)`` or
#: ``loss_mask='all' (--loss-mask all)``: on the command line only the flag is said
_BOTH_FORMS = re.compile(r"\b\w+=(?:True|'[^']*'|\d+) \((--[a-z][a-z0-9-]*(?: [^()\s]+)?)\)")


def describe(exc: BaseException) -> str:
    """The one-line message of an error a command stops on (an OS error: its file and why),
    worded for the command line: a remedy the library names as a Python argument and a flag
    is said as the flag alone."""
    if isinstance(exc, OSError) and not isinstance(exc, HSCaptureError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return _BOTH_FORMS.sub(r"\1", str(exc))


def json_error_too(as_json: bool, call: Callable[[], Any]) -> Any:
    """``call()``; with ``--json``, an error that stops it is also printed on stdout as
    ``{"error": message, "error_type": class name}`` (then raised as usual: one line on
    stderr, its exit code), so a script reading the command's JSON never finds it empty."""
    try:
        return call()
    except (HSCaptureError, OSError) as exc:
        if as_json:
            click.echo(json.dumps({"error": describe(exc), "error_type": type(exc).__name__},
                                  indent=2))
        raise
