"""Printing for the command line: tables or JSON on stdout, progress and errors on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["Output"]


class Output:
    """Where a command's results go: ``json`` for scripts, else rich tables; progress on stderr."""

    def __init__(self, as_json: bool, quiet: bool) -> None:
        self.as_json = as_json
        self.quiet = quiet
        self.out = Console(soft_wrap=True, highlight=False)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    def json(self, data: Any) -> None:
        """Print ``data`` as one JSON document."""
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Print a table (for people; scripts use ``--json``)."""
        table = Table(title=title, title_justify="left")
        for name in columns:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*("-" if v is None else str(v) for v in row))
        self.out.print(table)

    def line(self, text: str) -> None:
        """A line of text for people (nothing under ``--json``)."""
        if not self.as_json:
            self.out.print(text, markup=False)

    def error(self, text: str) -> None:
        """An error message on stderr."""
        self.err.print(f"checkpointers: error: {text}", markup=False)

    @contextmanager
    def progress(self, what: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        """A progress bar on stderr (a terminal only, not ``--quiet``); yields ``tick(n)``."""
        if self.quiet or not self.err.is_terminal:
            yield lambda n: None
            return
        columns = [
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ]
        with Progress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)
