"""An activated program (SPEC §6, Decision on activation): an echo service that the daemon
starts by external activation, and that exits once its queue is drained.

Configure it on the queue of the service it answers for::

    [[database.queue]]
    name = "EchoQueue"
    activation = { command = ["python", "../examples/activated_echo.py"], max_instances = 2 }

The command runs in the configuration file's directory (hence ``../examples`` for a file
in ``config/``), and ``python`` is the daemon's own interpreter. The daemon starts it with
``BROKERD_HOST``, ``BROKERD_PORT``, ``BROKERD_USER``, ``BROKERD_TOKEN_FILE``,
``BROKERD_DATABASE`` and ``BROKERD_QUEUE`` set (and ``BROKERD_TLS=1`` when the client
port speaks TLS: pass ``--tls-ca-file`` then). It serves the queue with
``BrokerClient.serve``: each batch of one conversation group is answered in one
transaction (a message of the same type, or ``--reply-type``, and body back on its
conversation; an EndDialog or Error is answered by ending the conversation), up to
``--readers`` batches at once. It exits when its readers have found the queue empty
``--idle-receives`` times in a row, or on SIGTERM (when the daemon stops) once the
batches it holds are done.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from brokerd.sdk.client import BrokerClient, ReceivedMessage, Transaction

log = logging.getLogger("activated_echo")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=2, help="readers at most (1 to 16)")
    parser.add_argument("--top", type=int, default=100, help="messages a RECEIVE takes at most")
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds a RECEIVE waits")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between growths")
    parser.add_argument("--idle-receives", type=int, default=3, help="empty RECEIVEs to exit")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of work per batch")
    parser.add_argument("--tls-ca-file", default=None, help="the CA of the client port")
    parser.add_argument(
        "--reply-type",
        default=None,
        help="the message type of the answers (default: each message's own; a contract "
        "that lets only the initiator send it needs a type the target may send)",
    )
    return parser.parse_args(argv)


async def echo(
    tx: Transaction, messages: list[ReceivedMessage], delay: float, reply_type: str | None = None
) -> None:
    """Answer each message on its conversation, in the batch's transaction, with its own
    type or ``reply_type``."""
    for message in messages:
        if message.is_end_dialog or message.is_error:
            await tx.end_conversation(message.conversation_handle)
        elif not message.is_timer:
            await tx.send(
                message.conversation_handle,
                reply_type or message.message_type_name,
                message.message_body,
            )
    if delay:
        await asyncio.sleep(delay)


async def main(argv: list[str]) -> int:
    args = parse_args(argv)
    env = os.environ
    try:
        host, port = env["BROKERD_HOST"], int(env["BROKERD_PORT"])
        token_file, queue = env["BROKERD_TOKEN_FILE"], env["BROKERD_QUEUE"]
    except (KeyError, ValueError) as exc:
        log.error("not started by brokerd's activation (BROKERD_* missing: %s)", exc)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with BrokerClient.connect(
        host,
        port,
        token_file=token_file,
        user=env.get("BROKERD_USER", "app"),
        tls_ca_file=args.tls_ca_file,
    ) as client:
        activation = client.serve(
            queue,
            lambda tx, messages: echo(tx, messages, args.delay, args.reply_type),
            database=env.get("BROKERD_DATABASE"),
            max_readers=args.readers,
            top=args.top,
            timeout=args.timeout,
            interval=args.interval,
            idle_receives=args.idle_receives,
            until_idle=True,
            stop=stop,
        )
        handled = await activation
    log.info(
        "pid %d: %d messages in %d batches, %d failed, %d readers at most",
        os.getpid(),
        handled,
        activation.batches,
        activation.failures,
        activation.peak_readers,
    )
    return 0


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sys.exit(asyncio.run(main(sys.argv[1:])))
