"""``python -m brokerd.tools.soak --seconds N --seed S --workdir DIR``: run the soak and
print its summary as JSON, whose ``clean`` the exit status tells (1 unless clean: no
violation, the queues drained, both streams carried traffic and no error, such as a
SEND refused or a producer stuck on a SEND).

``--netns NAME`` (root) runs it inside a new network namespace NAME, deleted
afterwards; without it, run it under ``ip netns exec`` yourself, or on loopback
addresses nothing else uses (``--base``: daemons at 127.0.0.base+1..4, proxies at
base+11..16). B is a mirrored pair with failovers among the faults unless
``--no-mirror``. ``--local-dialogs N`` sets how many dialogs at once run between two
services of one database of A (direct delivery; 0: none). ``check --workdir DIR``
runs the checker again on a finished run's ledgers (``clean``: no violation);
``consume`` is the consumer application the soak starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from brokerd.tools.soak import checker, consumer, driver, netns, topology


def _soak_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m brokerd.tools.soak", description=__doc__)
    p.add_argument("--seconds", type=float, default=150.0, help="how long faults go on")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--base", type=int, default=200, help="last octet base of the addresses")
    p.add_argument("--dialogs", type=int, default=6, help="dialogs per direction")
    p.add_argument(
        "--local-dialogs",
        type=int,
        default=driver.Settings.local_dialogs,
        help="dialogs at once inside one database of A (direct delivery); 0: none",
    )
    p.add_argument("--large", type=float, default=0.03, help="fraction of 100-300 KiB bodies")
    p.add_argument(
        "--drain-timeout", type=float, default=180.0, help="seconds without progress allowed"
    )
    p.add_argument(
        "--no-mirror", action="store_true", help="B is one daemon (no pair, no failovers)"
    )
    p.add_argument("--netns", help="create this network namespace and run inside it (root)")
    p.add_argument("--verbose", action="store_true", help="print every fault to stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["consume"]:
        parser = argparse.ArgumentParser(prog="python -m brokerd.tools.soak consume")
        consumer.add_arguments(parser)
        return consumer.run(parser.parse_args(args_list[1:]))
    if args_list[:1] == ["check"]:
        parser = argparse.ArgumentParser(prog="python -m brokerd.tools.soak check")
        parser.add_argument("--workdir", type=Path, required=True)
        parser.add_argument("--reply-every", type=int, default=driver.Settings.reply_every)
        args = parser.parse_args(args_list[1:])
        shown = checker.check(args.workdir / "ledgers", args.reply_every).summary()
        print(json.dumps(shown, indent=2))
        return 0 if shown["clean"] else 1
    args = _soak_parser().parse_args(args_list)
    if args.netns:
        i = args_list.index("--netns")
        inner = [*args_list[:i], *args_list[i + 2 :]]
        try:
            return netns.run_inside(
                args.netns, [sys.executable, "-m", "brokerd.tools.soak", *inner]
            )
        except RuntimeError as exc:  # the namespace could not be made
            print(f"soak: {exc}", file=sys.stderr)
            return 2
    settings = driver.Settings(
        seconds=args.seconds,
        seed=args.seed,
        workdir=args.workdir.resolve(),
        hosts=topology.Hosts(base=args.base),
        dialogs=args.dialogs,
        local_dialogs=args.local_dialogs,
        large_fraction=args.large,
        drain_timeout=args.drain_timeout,
        mirror=not args.no_mirror,
    )
    summary = driver.run(settings, verbose=args.verbose)
    print(json.dumps(summary, indent=2))
    return 0 if summary["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
