"""``brokerctl``: look inside a running brokerd daemon through its client listener.

    brokerctl [CONNECTION] [--json] [--wide] COMMAND
    brokerctl --config FILE endpoints            conversation endpoints (state, sequences)
    brokerctl --config FILE transmission-queue   messages not yet acknowledged (alias: tq)
    brokerctl --config FILE queues               queues and their ready messages
    brokerctl --config FILE routes               routes of every database
    brokerctl --config FILE connections          connections to other brokers
    brokerctl --config FILE databases            databases, broker instances and files
    brokerctl --config FILE stats                the dialog engine's counters
    brokerctl --config FILE drops                why messages were dropped
    brokerctl --config FILE mirrors              mirrored databases and routes (R-ROUTE-10)
    brokerctl --config FILE mirroring            replication of mirrored databases (R-ROUTE-16)
    brokerctl --config FILE ages                 endpoints by database, state and age (leaks)
    brokerctl --config FILE waiting              each conversation's oldest waiting message
    brokerctl --config FILE queue QUEUE          a queue's messages and their status (R-OBJ-3)
    brokerctl --config FILE ping                 is the daemon up, and who is it
    brokerctl --config FILE explain SERVICE (--database DB | --from-outside) [--broker-instance G]
                                                 which route a new conversation takes, and why
    brokerctl --config FILE route create DB NAME --address A [--service S] [--broker-instance G]
                                                 [--mirror-address M] [--lifetime SECONDS]
    brokerctl --config FILE route alter DB NAME [--address A] [--service S] ...
                                                 (NULL clears a field)
    brokerctl --config FILE route drop DB NAME
    brokerctl --config FILE mirror-role DB principal|mirror
                                                 failover: this partner's role (R-ROUTE-10)
    brokerctl --config FILE quarantined          conversations set aside by poison-message
                                                 handling: failing message, rollbacks, last error
    brokerctl --config FILE quarantine release HANDLE
                                                 its messages become receivable again
    brokerctl --config FILE quarantine end HANDLE --error-code N [--description TEXT]
                                                 END CONVERSATION WITH ERROR (the far side is told)
    brokerctl --config FILE watch VIEW [--interval S] [--count N]
                                                 redraw a view until Ctrl-C (or N times)
    brokerctl trace CONVERSATION [SEQ] (--traces DIR | --config FILE)...
                                                 where is my message: its path across the
                                                 daemons' trace files, and why it waited

CONNECTION is either ``--config FILE``, the daemon's own TOML file (the client
listener's host and port and the token file are read from its ``[client]``
table; the environment variable ``BROKERD_CONFIG`` stands in for a missing
``--config``), or ``--host HOST --port PORT --token-file FILE``. Explicit
``--host``/``--port``/``--token-file`` override what the file says. Options may
be given before or after the command. ``--user NAME`` logs in with a
``[[client.token]]`` (give its ``--token-file``); without it, the admin token.
A client port with TLS (``[client] tls_certificate``) is reached with
``--tls-ca-file FILE``, the CA that issued its certificate; with ``--config`` it
defaults to the endpoint's ``ca_certificate`` (the deployment CA) when the file
turns TLS on.

Views print as aligned text tables: UUIDs are shortened to their last 8
characters (random in every UUID brokerd makes: a conversation handle begins with
the time it was made), timestamps to whole seconds and long text to 40 characters unless
``--wide`` is given (which also shows the full column names); a message's
``transmission_status`` is always kept whole, as the last column; a row is always one
line (control characters in a cell are shown as escapes). ``--json`` prints the
daemon's rows unchanged (``watch --json`` prints one JSON document a line; ``route``,
``mirror-role`` and ``quarantine`` print one JSON object: what was done). An empty
view prints ``(no rows)``. Times are UTC (``Z``), ``watch``'s clock too. Every view is
read page after page (the daemon's replies are bounded), so a view of any size prints
whole.

``trace`` needs no running daemon: it reads the trace files (docs/traces.md) of every
daemon named, by folder (``--traces``) or by configuration file (``--config``, once per
daemon; ``[trace] directory``), and prints each step of the message (or of every message
of the conversation) with the time since the step before and why it waited
(:mod:`brokerd.admin.trace`).

Errors (daemon not running, wrong token, unknown view, bad configuration, a
conversation the traces do not hold) print one line ``brokerctl: error: ...`` and
exit with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import io
import json
import math
import os
import ssl
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.admin import trace as tracing
from brokerd.admin.tables import display_rows, format_table
from brokerd.sdk.client import DEFAULT_PORT, BrokerClient
from protocol.errors import AuthenticationFailed, BrokerError, ClientError, RemoteError

PROG = "brokerctl"
ENV_CONFIG = "BROKERD_CONFIG"
DEFAULT_HOST = "127.0.0.1"

VIEWS: dict[str, str] = {
    "endpoints": "conversation_endpoints",
    "transmission-queue": "transmission_queue",
    "tq": "transmission_queue",
    "queues": "queues",
    "routes": "routes",
    "connections": "broker_connections",
    "databases": "databases",
    "stats": "stats",
    "drops": "drops",
    "mirrors": "mirrors",
    "mirroring": "mirroring",
    "ages": "endpoint_ages",
    "waiting": "oldest_waiting",
    "quarantined": "quarantined",
    "activation": "activation",
}
"""Command name -> the daemon's view name."""

_VIEW_HELP = {
    "endpoints": "conversation endpoints: group, state, lifetime, timer, sequence numbers, "
    "unacknowledged messages",
    "transmission-queue": "messages sent but not yet acknowledged by the far broker, "
    "EndDialog and Error flagged",
    "queues": "queues, their status, ready messages and readers (RECEIVEs waiting, groups held)",
    "routes": "routes of every database",
    "connections": "connections to and from other brokers",
    "databases": "databases, their broker instances and files",
    "stats": "the dialog engine's counters",
    "drops": "reasons of dropped messages",
    "mirrors": "mirrored databases here, and which partner is principal for each mirrored route",
    "mirroring": "each replicated database's role, partner, LSN, whether the mirror is attached "
    "and confirmed, and what waits for it (R-ROUTE-16)",
    "ages": "endpoints counted by database, state and age: leaked dialogs show here",
    "waiting": "per conversation, its oldest message waiting to be received or acknowledged, "
    "oldest first",
    "quarantined": "conversations set aside by poison-message handling: the failing message, "
    "its rollbacks and last error",
    "activation": "activated queues: their command, instances running, started and exited",
}


class CtlError(Exception):
    """A problem to report in one line, exit status 2."""


# --------------------------------------------------------------------------- connection


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    token_file: Path | None
    user: str = "admin"
    tls_ca_file: Path | None = None

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def resolve_target(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Target:
    """Host, port and token file from --config / BROKERD_CONFIG and the explicit options."""
    environ = dict(os.environ) if environ is None else environ
    config_path: str | None = getattr(args, "config", None)
    source = "--config"
    if config_path is None and environ.get(ENV_CONFIG):
        config_path, source = environ[ENV_CONFIG], ENV_CONFIG
    host, port, token_file = DEFAULT_HOST, DEFAULT_PORT, None
    tls_ca_file: Path | None = None
    if config_path is not None:
        from brokerd.config import load_config

        try:
            config = load_config(config_path)
        except (BrokerError, OSError, ValueError) as exc:  # ConfigError: "FILE: KEY: problem"
            raise CtlError(f"{exc} (from {source})") from None
        host, port, token_file = config.client.host, config.client.port, config.client.token_file
        if config.client.tls:
            tls_ca_file = config.endpoint.ca_certificate
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if getattr(args, "host", None):
        host = args.host
    if getattr(args, "port", None) is not None:
        port = _port(args.port)
    if getattr(args, "token_file", None) is not None:
        token_file = Path(args.token_file)
    if getattr(args, "tls_ca_file", None) is not None:
        tls_ca_file = Path(args.tls_ca_file)
    if token_file is None:
        raise CtlError(
            f"no credentials: give --config FILE (the daemon's configuration; or set "
            f"{ENV_CONFIG}) or --token-file FILE"
        )
    return Target(host, port, token_file, getattr(args, "user", None) or "admin", tls_ca_file)


def _read_token(target: Target) -> str:
    assert target.token_file is not None
    try:
        token = target.token_file.read_text().strip()
    except UnicodeDecodeError:
        raise CtlError(f"token file {target.token_file} is not a token (not text)") from None
    except OSError as exc:
        hint = (
            " — has the daemon been started? (it creates the token file on first start)"
            if isinstance(exc, FileNotFoundError)
            else ""
        )
        raise CtlError(
            f"cannot read token file {target.token_file}: {exc.strerror or exc}{hint}"
        ) from None
    if not token:
        raise CtlError(f"token file {target.token_file} is empty")
    return token


async def connect(target: Target, timeout: float) -> BrokerClient:
    """Log in to the daemon, turning every failure into one CtlError line."""
    token = _read_token(target)
    prefix = f"cannot connect to brokerd at {target.where}"
    try:
        # The SDK bounds the TCP connect and the challenge, not the login answer.
        return await asyncio.wait_for(
            BrokerClient.connect(
                target.host,
                target.port,
                token=token,
                user=target.user,
                timeout=timeout,
                tls_ca_file=target.tls_ca_file,
            ),
            timeout + 1.0,
        )
    except AuthenticationFailed:
        raise CtlError(
            f"brokerd at {target.where} refused the token in {target.token_file} for user "
            f"{target.user!r} — wrong token file, or the token of another daemon? (see [client] "
            "token_file and [[client.token]] in its configuration)"
        ) from None
    except ClientError as exc:
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLError):
            raise CtlError(f"{exc} (--tls-ca-file)") from None
        if isinstance(cause, ConnectionRefusedError):
            raise CtlError(f"{prefix}: connection refused — is the daemon running?") from None
        if isinstance(cause, TimeoutError):
            raise CtlError(f"{prefix}: no answer in {timeout:g} s") from None
        if isinstance(cause, OSError):
            raise CtlError(f"{prefix}: {cause.strerror or cause}") from None
        raise CtlError(f"{prefix}: {exc} — is that the client port of a brokerd daemon?") from None
    except TimeoutError:
        raise CtlError(
            f"{prefix}: no login challenge in {timeout:g} s — is that the client port of a "
            "brokerd daemon?"
        ) from None


async def _call(client: BrokerClient, target: Target, coro: Any, timeout: float) -> Any:
    name = f"brokerd {client.instance}" if client.instance else "brokerd"
    try:
        return await asyncio.wait_for(coro, timeout)
    except RemoteError as exc:
        raise CtlError(f"{name} at {target.where}: {exc.remote_message}") from None
    except (ClientError, BrokerError) as exc:  # BrokerError: a request that does not encode
        raise CtlError(f"{name} at {target.where}: {exc}") from None
    except TimeoutError:
        raise CtlError(f"{name} at {target.where} did not answer in {timeout:g} s") from None


# --------------------------------------------------------------------------- commands


def _view_name(name: str) -> str:
    if name in VIEWS:
        return VIEWS[name]
    if name in VIEWS.values():  # the daemon's own names are fine too
        return name
    known = ", ".join(sorted(VIEWS))
    raise CtlError(f"unknown view {name!r}; views: {known}")


def _render(view: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    if args.json:
        return json.dumps(rows, indent=2)
    return format_table(display_rows(view, rows), wide=args.wide)


async def _show(args: argparse.Namespace, target: Target) -> None:
    view = _view_name(args.command)
    async with await connect(target, args.timeout) as client:
        rows = await _call(client, target, client.view(view), args.timeout)
    print(_render(view, rows, args))


async def _queue(args: argparse.Namespace, target: Target) -> None:
    async with await connect(target, args.timeout) as client:
        # The rows as the daemon sends them: a table and --json print dictionaries.
        rows = await _call(
            client, target, client.view("queue_messages", queue=args.queue), args.timeout
        )
    print(_render("queue_messages", rows, args))


async def _ping(args: argparse.Namespace, target: Target) -> None:
    async with await connect(target, args.timeout) as client:
        t0 = time.perf_counter()
        meta = await _call(client, target, client.ping(), args.timeout)
        rtt = (time.perf_counter() - t0) * 1000
    instance, pid = meta.get("instance", client.instance), meta.get("pid")
    if args.json:
        doc = {"instance": instance, "pid": pid, "host": target.host, "port": target.port}
        print(json.dumps({**doc, "rtt_ms": round(rtt, 3)}, indent=2))
    else:
        print(f"brokerd {instance} at {target.where} is up (pid {pid}, {rtt:.1f} ms)")


async def _watch(args: argparse.Namespace, target: Target) -> None:
    view = _view_name(args.view)
    if not args.interval > 0:
        raise CtlError(f"--interval must be a positive number of seconds, not {args.interval:g}")
    if args.count is not None and args.count < 1:
        raise CtlError(f"--count must be at least 1, not {args.count}")
    clear = sys.stdout.isatty() and not args.json
    async with await connect(target, args.timeout) as client:
        shown = 0
        while True:
            rows = await _call(client, target, client.view(view), args.timeout)
            if args.json:
                print(json.dumps(rows), flush=True)
            else:
                stamp = time.strftime("%H:%M:%SZ", time.gmtime())  # UTC, as the views
                title = (
                    f"{args.view} on brokerd {client.instance} at {target.where}, "
                    f"every {args.interval:g} s — {stamp}"
                )
                table = format_table(display_rows(view, rows), wide=args.wide)
                screen = f"{title}\n\n{table}"
                if clear:
                    print("\x1b[H\x1b[2J" + screen, flush=True)
                else:
                    print(("\n" if shown else "") + screen, flush=True)
            shown += 1
            if args.count is not None and shown >= args.count:
                return
            await asyncio.sleep(args.interval)


def format_explain(result: dict[str, Any]) -> str:
    """The explain result as numbered steps and a last line with the decision."""
    if result["from_outside"]:
        title = f"a message for service {result['service']!r} arriving from outside (msdb routes)"
    else:
        title = (
            f"a new conversation to service {result['service']!r} begun in database "
            f"{result['database']!r}"
        )
    if result.get("broker_instance"):
        title += f", broker instance {result['broker_instance']}"
    lines = [f"explain: {title}"]
    steps = [s for s in result["steps"] if not s.startswith("decision:")]
    lines += [f"  {i:2d}. {step}" for i, step in enumerate(steps, 1)]
    where = {
        "local": f"deliver to database {result['target_database']!r}",
        "network": f"send to {result.get('principal') or result['address']}",
        "delayed": "the messages wait in the transmission queue",
        "drop": "not acknowledged; the sender keeps the message and retries",
    }[result["decision"]]
    via = f" via route {result['route']}" if result["route"] else ""
    lines.append(f"decision: {result['decision'].upper()}{via}: {where}")
    lines.append(f"reason: {result['reason']}")
    if result.get("mirror_address"):
        principal = result.get("principal") or "not known yet"
        lines.append(
            f"          (mirrored: {result['address']} / {result['mirror_address']}; "
            f"principal: {principal})"
        )
    if result.get("note"):
        lines.append(f"note: {result['note']}")
    return "\n".join(lines)


async def _explain(args: argparse.Namespace, target: Target) -> None:
    if not args.from_outside and not args.database:
        raise CtlError(
            "explain needs --database DB (where the conversation begins) or --from-outside"
        )
    async with await connect(target, args.timeout) as client:
        result = await _call(
            client,
            target,
            client.explain(
                args.service,
                database=args.database,
                broker_instance=args.broker_instance,
                from_outside=args.from_outside,
            ),
            args.timeout,
        )
    print(json.dumps(result, indent=2) if args.json else format_explain(result))


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise CtlError(f"--lifetime must be a positive number of seconds, not {value!r}")
    return seconds


def _port(value: str) -> int:
    """A ``--port``: 1 to 65535."""
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise CtlError(f"--port must be a port number from 1 to 65535, not {value!r}")
    return port


def _done(args: argparse.Namespace, text: str, done: str, **more: Any) -> None:
    """What a command that changes the daemon did: ``text``, or with ``--json`` one JSON
    object (the command's arguments, what was ``done`` and ``more``), as every command's
    ``--json`` output is JSON (R-OBJ-5 routes, R-ROUTE-10 roles, SPEC §6 quarantines)."""
    if not args.json:
        print(text)
        return
    given = ("action", "database", "name", "role", "error_code", "description")
    doc = {"command": args.command, **{k: getattr(args, k) for k in given if hasattr(args, k)}}
    print(json.dumps({**doc, "done": done, **more}, indent=2))


def _null(value: str | None) -> str | None:
    return None if value is None or value.upper() == "NULL" else value


async def _route(args: argparse.Namespace, target: Target) -> None:
    fields = {
        "address": args.address,
        "remote_service_name": args.service,
        "broker_instance": args.broker_instance,
        "mirror_address": args.mirror_address,
        "lifetime": args.lifetime,
    }
    async with await connect(target, args.timeout) as client:
        if args.action == "create":
            if args.address is None:
                raise CtlError("route create needs --address (LOCAL, TRANSPORT or tcp://host:port)")
            lifetime = _seconds(args.lifetime) if args.lifetime is not None else None
            await _call(
                client,
                target,
                client.create_route(
                    args.database,
                    args.name,
                    args.address,
                    remote_service_name=_null(args.service),
                    broker_instance=_null(args.broker_instance),
                    mirror_address=_null(args.mirror_address),
                    lifetime=lifetime,
                ),
                args.timeout,
            )
            _done(args, f"route {args.name} created in database {args.database}", "created")
        elif args.action == "alter":
            changes: dict[str, Any] = {}
            for key, value in fields.items():
                if value is None:
                    continue
                if key == "lifetime" and value.upper() != "NULL":
                    changes[key] = _seconds(value)
                else:
                    changes[key] = _null(value)
            if not changes:
                raise CtlError("route alter: give at least one field to change")
            await _call(
                client,
                target,
                client.alter_route(args.database, args.name, **changes),
                args.timeout,
            )
            _done(args, f"route {args.name} altered in database {args.database}", "altered")
        else:
            await _call(client, target, client.drop_route(args.database, args.name), args.timeout)
            _done(args, f"route {args.name} dropped from database {args.database}", "dropped")


async def _mirror_role(args: argparse.Namespace, target: Target) -> None:
    async with await connect(target, args.timeout) as client:
        await _call(client, target, client.set_mirror_role(args.database, args.role), args.timeout)
    _done(args, f"database {args.database} is now the {args.role} partner", "role set")


async def _quarantine(args: argparse.Namespace, target: Target) -> None:
    try:
        handle = uuid.UUID(args.handle)
    except ValueError:
        raise CtlError(f"{args.handle!r} is not a conversation handle (a UUID)") from None
    async with await connect(target, args.timeout) as client:
        if args.action == "release":
            released = await _call(client, target, client.release_quarantine(handle), args.timeout)
            text = f"conversation {handle} released: {released} message(s) receivable again"
            _done(args, text, "released", conversation_handle=str(handle), released=released)
            return
        if args.error_code is None:
            raise CtlError("quarantine end needs --error-code N (greater than 0)")
        await _call(
            client,
            target,
            client.end_quarantined(handle, args.error_code, args.description),
            args.timeout,
        )
    text = f"conversation {handle} ended with error {args.error_code}"
    _done(args, text, "ended", conversation_handle=str(handle))


# --------------------------------------------------------------------------- parser


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    """The options every command takes; on subcommands they default to 'not given'.

    (A subcommand's defaults would otherwise overwrite what was given before it.)
    """

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    conn = parser.add_argument_group("connection")
    conn.add_argument(
        "--config",
        metavar="FILE",
        default=default(None),
        help=f"the daemon's TOML configuration (default: ${ENV_CONFIG})",
    )
    conn.add_argument("--host", default=default(None), help="the client listener's address")
    conn.add_argument("--port", default=default(None), help=f"its port (default {DEFAULT_PORT})")
    conn.add_argument(
        "--token-file", metavar="FILE", default=default(None), help="the daemon's client token"
    )
    conn.add_argument(
        "--user",
        metavar="NAME",
        default=default(None),
        help="the login name: a [[client.token]] name, or none for the admin token",
    )
    conn.add_argument(
        "--tls-ca-file",
        metavar="FILE",
        default=default(None),
        help="the CA that issued the client port's TLS certificate (the port uses TLS)",
    )
    conn.add_argument(
        "--timeout", type=float, default=default(5.0), help="seconds to wait (default 5)"
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON (the raw rows)"
    )
    out.add_argument(
        "--wide",
        action="store_true",
        default=default(False),
        help="do not shorten UUIDs, timestamps, text or column names",
    )


def _trace(args: argparse.Namespace) -> None:
    try:
        tracing.run(args.conversation, args.seq, args.traces, args.trace_configs, args.json)
    except tracing.TraceNotFound as exc:
        raise CtlError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Look inside a running brokerd daemon through its client listener.",
        epilog=f"The daemon's configuration may also come from ${ENV_CONFIG}.",
    )
    _common(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in _VIEW_HELP.items():
        aliases = ["tq"] if name == "transmission-queue" else []
        sub = commands.add_parser(name, aliases=aliases, help=text, description=text)
        _common(sub, top=False)
        sub.set_defaults(func=_show)
    text = (
        "a queue's messages, with their status: 0 received and retained, 1 ready, "
        "2 not yet complete, 3 sent and retained"
    )
    queue = commands.add_parser("queue", help=text, description=text)
    queue.add_argument("queue", metavar="QUEUE", help="the queue's name")
    _common(queue, top=False)
    queue.set_defaults(func=_queue)
    ping = commands.add_parser("ping", help="check that the daemon answers")
    _common(ping, top=False)
    ping.set_defaults(func=_ping)
    watch = commands.add_parser("watch", help="redraw a view every few seconds until Ctrl-C")
    watch.add_argument("view", metavar="VIEW", help=f"one of: {', '.join(sorted(VIEWS))}")
    watch.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes"
    )
    watch.add_argument("--count", type=int, metavar="N", help="stop after N refreshes")
    _common(watch, top=False)
    watch.set_defaults(func=_watch)

    explain = commands.add_parser(
        "explain", help="which route a new conversation to a service takes now, step by step"
    )
    explain.add_argument("service", metavar="SERVICE", help="the target service name")
    explain.add_argument("--database", metavar="DB", help="where the conversation begins")
    explain.add_argument(
        "--from-outside",
        action="store_true",
        help="explain a message arriving from another broker (msdb's routes, R-ROUTE-1)",
    )
    explain.add_argument("--broker-instance", metavar="GUID", help="the target broker instance")
    _common(explain, top=False)
    explain.set_defaults(func=_explain)

    route = commands.add_parser("route", help="create, alter or drop a route (persisted)")
    route.add_argument("action", choices=("create", "alter", "drop"))
    route.add_argument("database", metavar="DB")
    route.add_argument("name", metavar="NAME")
    route.add_argument("--address", help="LOCAL, TRANSPORT or tcp://host:port")
    route.add_argument("--service", help="remote_service_name (default NULL: any service)")
    route.add_argument("--broker-instance", metavar="GUID", help="default NULL: any broker")
    route.add_argument("--mirror-address", metavar="ADDRESS", help="tcp://host:port")
    route.add_argument("--lifetime", metavar="SECONDS", help="expiry, in seconds from now")
    _common(route, top=False)
    route.set_defaults(func=_route)

    mirror = commands.add_parser(
        "mirror-role", help="failover: make this partner the principal or the mirror"
    )
    mirror.add_argument("database", metavar="DB")
    mirror.add_argument("role", choices=("principal", "mirror"))
    _common(mirror, top=False)
    mirror.set_defaults(func=_mirror_role)

    quarantine = commands.add_parser(
        "quarantine", help="release a quarantined conversation, or end it with an error"
    )
    quarantine.add_argument("action", choices=("release", "end"))
    quarantine.add_argument("handle", metavar="HANDLE", help="the conversation handle")
    quarantine.add_argument("--error-code", type=int, metavar="N", help="end: the error code")
    quarantine.add_argument("--description", default="", help="end: the error's description")
    _common(quarantine, top=False)
    quarantine.set_defaults(func=_quarantine)

    follow = commands.add_parser(
        "trace",
        help="where is my message: its path across the daemons' trace files, and why it waited",
        description="Follow a message (or every message of a conversation) through the "
        "daemons' trace files: each step, on which broker, the time since the step before "
        "and why it waited. No daemon needs to run.",
    )
    follow.add_argument("conversation", metavar="CONVERSATION", help="the conversation id")
    follow.add_argument("seq", metavar="SEQ", type=int, nargs="?", help="one message's number")
    follow.add_argument(
        "--traces", metavar="DIR", action="append", help="a daemon's trace folder (repeat)"
    )
    follow.add_argument(
        "--config",
        metavar="FILE",
        dest="trace_configs",
        action="append",
        help="a daemon's configuration, for its [trace] directory (repeat, one per daemon)",
    )
    follow.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the paths as JSON"
    )
    follow.set_defaults(func=_trace)
    return parser


_FAILING = ("strict", "surrogateescape")
"""Error handlers of a text stream that raise on a character its encoding lacks."""


def _tolerant_stdout() -> None:
    """In a locale that is not UTF-8 (``LC_ALL=C`` without Python's UTF-8 mode, a Latin-1
    terminal), a character standard output cannot encode (a table's ``…``, a service's
    name) is written as an escape, as on standard error, rather than end the command with
    a traceback."""
    stream = sys.stdout
    if not isinstance(stream, io.TextIOWrapper) or stream.errors not in _FAILING:
        return
    try:
        utf8 = codecs.lookup(stream.encoding).name == "utf-8"
    except LookupError:
        utf8 = False
    if not utf8:
        stream.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    _tolerant_stdout()
    args = build_parser().parse_args(argv)
    if args.command == "tq":
        args.command = "transmission-queue"
    try:
        if args.command == "trace":  # reads files: no daemon, no connection
            if isinstance(args.config, str):  # given before the command: one daemon's
                args.trace_configs = [*(args.trace_configs or []), args.config]
            if not args.traces and not args.trace_configs and os.environ.get(ENV_CONFIG):
                args.trace_configs = [os.environ[ENV_CONFIG]]
            args.func(args)
            return 0
        if args.command == "watch":
            _view_name(args.view)  # an unknown view is an error before connecting
        if not args.timeout > 0:
            raise CtlError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
        target = resolve_target(args)
        asyncio.run(args.func(args, target))
    except CtlError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0 if args.command == "watch" else 130
    except BrokenPipeError:  # brokerctl ... | head
        devnull = os.open(os.devnull, os.O_WRONLY)  # silence the flush at exit
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
