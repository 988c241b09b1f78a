"""The CLI's stderr console and its one rule for errors: one line, a non-zero exit, never a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from rooftop.errors import RooftopError

err = Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Bad input ends in one line on stderr and exit code 1; Ctrl-C in exit code 130."""
    try:
        yield
    except RooftopError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err.print("\ninterrupted")
        raise typer.Exit(130) from None
