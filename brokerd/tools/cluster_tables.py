"""The tables ``brokerd cluster`` prints (``rich``): the members once up, their live
status, and what ``down`` did."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from brokerd.tools.cluster import Member, MemberStatus


def _console() -> Console:
    """The terminal, or 160 columns when the output is not one (a file, a pipe)."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(
            column, justify="right" if column in ("pid", "unacked", "links") else "left"
        )
    return table


def print_up(members: list[Member], console: Console | None = None) -> None:
    table = _table("brokerd cluster: up", "broker", "role", "address", "pid", "client", "admin")
    for m in members:
        table.add_row(
            m.name, m.role, m.address, str(m.pid), f"{m.host}:{m.client_port}", m.admin_url
        )
    (console or _console()).print(table)


def print_status(rows: list[MemberStatus], console: Console | None = None) -> None:
    table = _table(
        "brokerd cluster: status", "broker", "pid", "address", "state", "queues", "unacked", "links"
    )
    for s in rows:
        m = s.member
        state = (
            "[green]ready[/]" if s.ready else ("[yellow]starting[/]" if s.alive else "[red]down[/]")
        )
        queues = ", ".join(f"{q}={n}" for q, n in s.queues) or "-"
        table.add_row(
            m.name, str(m.pid), m.address, state, queues, str(s.unacknowledged), str(s.connections)
        )
    (console or _console()).print(table)


def print_down(rows: list[tuple[Member, str]], console: Console | None = None) -> None:
    table = _table("brokerd cluster: down", "broker", "pid", "outcome")
    for m, outcome in rows:
        table.add_row(m.name, str(m.pid), outcome)
    (console or _console()).print(table)
