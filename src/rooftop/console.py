"""The CLI's stderr console and its one rule for errors: one line, a non-zero exit, never a traceback."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from rooftop.errors import InvalidRequestError, RooftopError

err = Console(stderr=True, highlight=False, soft_wrap=True)


def logged(update: Callable[[str], None]) -> Callable[[str], None]:
    """A live display's update (a bar's, a status line's) that, where stderr is no terminal (a log, where rich draws
    no live display), also prints each stage on a line of its own: a long benchmark is not silent for minutes."""
    if err.is_terminal:
        return update

    def both(what: str) -> None:
        update(what)
        err.print(f"[dim]{escape(what)}[/]")

    return both


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


def check_output_file(path: Path | None, option: str) -> None:
    """Refuse a file an option names for output that could not be written, before the work that fills it runs (a
    benchmark's minutes lost to a mistyped folder): a folder there, a folder that does not exist, one not writable."""
    if path is None:
        return
    if path.is_dir():
        raise InvalidRequestError(f"{option} {path}: a folder, not a file")
    folder = path.parent
    if not folder.is_dir():
        raise InvalidRequestError(f"{option} {path}: no folder {folder}")
    if not os.access(path if path.exists() else folder, os.W_OK):
        raise InvalidRequestError(f"{option} {path}: not writable here")


def check_output_folder(path: Path | None, option: str) -> None:
    """Refuse a folder an option names for output (made where missing) that could not be: a file there, or a nearest
    existing folder not writable."""
    if path is None:
        return
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise InvalidRequestError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise InvalidRequestError(f"{option} {path}: {existing} is not writable here")
