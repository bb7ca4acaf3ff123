"""The ``brokerd`` command line: run a daemon, certificates, demonstrations.

    brokerd certs ca --dir DIR [--name NAME] [--days N] [--key-type ed25519|ec-p256]
    brokerd certs instance NAME --dir DIR [--days N] [--key-type ...] [--san HOST]...
    brokerd certs service NAME --dir DIR [--days N] [--stem STEM]
    brokerd run --config FILE [--ready-file FILE] [--log-level LEVEL]
    brokerd demo [--orders N] [--workdir DIR] [--first-address 127.0.0.1] [--no-analytics]
    brokerd wire-demo [--encryption required|supported|disabled]
    brokerd analyze TRACE_DIR... [--out DIR] [--master URL | --server SOCKET] [--top N]
                    [--quiet] [--database FILE...]
    brokerd analyzer SOCKET [--master URL] [--warm-up N]
    brokerd cluster up|down|status [DIR] [--first-address 127.0.0.1]

Errors (a wrong configuration included) print one line naming the problem and
exit with status 2. ``analyze`` exits with 1 when the exactly-once-in-order
audit finds a violation; ``cluster status`` with 1 when a member is not ready (or
there is no cluster).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from brokerd.errors import AnalyticsError, ClusterError
from brokerd.tools import certs
from protocol import BrokerError, EncryptionMode

if TYPE_CHECKING:
    from brokerd.analytics.service import Witness


def _certs_ca(args: argparse.Namespace) -> None:
    issued = certs.create_ca(args.name, days=args.days, key_type=args.key_type)
    for path in certs.write_pair(args.dir, "ca", issued, overwrite=args.force):
        print(f"wrote {path}")


def _certs_instance(args: argparse.Namespace) -> None:
    if not (args.dir / "ca.pem").exists() or not (args.dir / "ca.key").exists():
        raise FileNotFoundError(
            f"no CA in {args.dir} (expected ca.pem and ca.key; run 'brokerd certs ca' first)"
        )
    ca = certs.read_pair(args.dir, "ca")
    issued = certs.issue_instance(
        ca, args.name, days=args.days, key_type=args.key_type, alt_names=args.san
    )
    for path in certs.write_pair(args.dir, args.name, issued, overwrite=args.force):
        print(f"wrote {path}")


def _certs_service(args: argparse.Namespace) -> None:
    if not (args.dir / "ca.pem").exists() or not (args.dir / "ca.key").exists():
        raise FileNotFoundError(
            f"no CA in {args.dir} (expected ca.pem and ca.key; run 'brokerd certs ca' first)"
        )
    ca = certs.read_pair(args.dir, "ca")
    issued = certs.issue_service(ca, args.name, days=args.days)
    stem = args.stem or certs.service_stem(args.name)
    for path in certs.write_pair(args.dir, stem, issued, overwrite=args.force):
        print(f"wrote {path}")


def _demo(args: argparse.Namespace) -> None:
    try:
        from brokerd.tools import cluster_demo
    except ModuleNotFoundError as exc:
        raise ClusterError(
            f"brokerd demo runs the application guide's example ({exc}): run it from a "
            "checkout of brokerd (./dev demo, or python -m brokerd demo in its directory)"
        ) from exc
    cluster_demo.run(
        args.workdir,
        first_address=args.first_address,
        orders=args.orders,
        analytics=args.analytics,
    )


def _wire_demo(args: argparse.Namespace) -> None:
    from brokerd.tools.demo import run_demo

    result = run_demo(encryption=EncryptionMode[args.encryption.upper()])
    if not (result["intact"] and result["corrupted_messages"] and result["refused"]):
        raise SystemExit("demo did not behave as expected")


def _analyze(args: argparse.Namespace) -> int:
    from brokerd.storage.witness import endpoint_sequences

    witness = []
    for path in args.database:
        try:
            witness += endpoint_sequences(path)
        except sqlite3.Error as exc:
            raise AnalyticsError(f"{path}: not a brokerd database file ({exc})") from exc
    if args.server is not None:
        return _analyze_by(args, witness)
    try:
        from brokerd.analytics.report import run
    except ModuleNotFoundError as exc:
        raise AnalyticsError(
            f"brokerd analyze needs PySpark ({exc}): pip install 'brokerd[analytics]'"
        ) from exc
    return run(args, witness)


def _analyze_by(args: argparse.Namespace, witness: list[Witness]) -> int:
    """``brokerd analyze --server SOCKET``: the same analysis, by a running analyzer."""
    from brokerd.analytics.service import Request, ask

    if args.master is not None:
        raise AnalyticsError("--master and --server: the analyzer runs on its own master")
    request = Request(
        tuple(p.resolve() for p in args.paths), args.out.resolve(), args.top, tuple(witness)
    )
    result = ask(args.server, request, None if args.quiet else sys.stderr)
    print(result["text"], end="")
    print(f"\nwrote {result['summary']} and {result['html']}")
    return 0 if result["passed"] else 1


def _top(value: str) -> int:
    """``--top``: the rows kept per table, as the analyzer takes them (1 to ``MAX_TOP``),
    alone or with ``--server`` (R-REPORT-3)."""
    from brokerd.analytics.service import MAX_TOP

    try:
        top = int(value)
    except ValueError:
        top = 0
    if not 0 < top <= MAX_TOP:
        raise argparse.ArgumentTypeError(f"an integer from 1 to {MAX_TOP:,}, not {value!r}")
    return top


def _analyzer(args: argparse.Namespace) -> int:
    try:
        from brokerd.analytics.service import serve
    except ModuleNotFoundError as exc:
        raise AnalyticsError(
            f"brokerd analyzer needs PySpark ({exc}): pip install 'brokerd[analytics]'"
        ) from exc
    return serve(args.socket, args.master, args.warm_up)


def _cluster(args: argparse.Namespace) -> int:
    from brokerd.tools import cluster, cluster_tables, topology

    if args.action == "up":
        cluster_tables.print_up(cluster.up(args.dir, topology.local(args.first_address)))
        return 0
    if args.action == "down":
        cluster_tables.print_down(cluster.down(args.dir))
        return 0
    rows = cluster.status(args.dir)
    if not rows:
        print(f"no cluster in {args.dir} ('brokerd cluster up {args.dir}' starts one)")
        return 1
    cluster_tables.print_status(rows)
    return 0 if all(r.ready for r in rows) else 1


def _run(args: argparse.Namespace) -> None:
    from brokerd.server.daemon import run

    run(args.config, args.ready_file, args.log_level)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="brokerd", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    cert_cmd = commands.add_parser("certs", help="create the deployment CA and certificates")
    cert_kinds = cert_cmd.add_subparsers(dest="kind", required=True)
    ca = cert_kinds.add_parser("ca", help="create a deployment CA (ca.pem, ca.key)")
    ca.add_argument("--name", default="brokerd deployment CA")
    ca.set_defaults(func=_certs_ca, days=3650)
    inst = cert_kinds.add_parser("instance", help="issue an instance certificate")
    inst.add_argument("name", help="instance name (certificate common name)")
    inst.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="HOST",
        help="a host name or IP address clients use to reach the instance over TLS "
        "([client] tls_certificate); repeat for several",
    )
    inst.set_defaults(func=_certs_instance, days=825)
    for sub in (ca, inst):
        sub.add_argument("--dir", type=Path, required=True, help="directory of the CA files")
        sub.add_argument("--days", type=int, help="validity in days")
        sub.add_argument("--key-type", choices=certs.KEY_TYPES, default="ed25519")
        sub.add_argument("--force", action="store_true", help="overwrite existing files")
    svc = cert_kinds.add_parser(
        "service", help="issue a service certificate for dialog security (EC P-256)"
    )
    svc.add_argument("name", help="service name (certificate common name), e.g. //shop/Client")
    svc.add_argument("--dir", type=Path, required=True, help="directory of the CA files")
    svc.add_argument("--days", type=int, default=825, help="validity in days")
    svc.add_argument("--stem", help="file name stem (default: from the service name)")
    svc.add_argument("--force", action="store_true", help="overwrite existing files")
    svc.set_defaults(func=_certs_service)

    run = commands.add_parser("run", help="run one broker daemon")
    run.add_argument("--config", type=Path, required=True, help="the instance's TOML file")
    run.add_argument("--ready-file", type=Path, help="write the PID here once listening")
    run.add_argument("--log-level", default="INFO")
    run.set_defaults(func=_run)

    demo = commands.add_parser(
        "demo",
        help="the local cluster, the application guide's story with a mirror failover, "
        "and the analytics over its traces",
    )
    demo.add_argument(
        "--orders", type=int, default=300, help="orders of the activation-under-load part"
    )
    demo.add_argument(
        "--workdir",
        type=Path,
        default=Path("demo"),
        help="the cluster's files and the report (default ./demo; an earlier run's are removed)",
    )
    demo.add_argument(
        "--first-address",
        default="127.0.0.1",
        help="the first broker's loopback address; the others take the next five",
    )
    demo.add_argument(
        "--no-analytics",
        dest="analytics",
        action="store_false",
        help="skip the PySpark report (Java 17 and brokerd[analytics] are then not needed)",
    )
    demo.set_defaults(func=_demo)

    wire = commands.add_parser(
        "wire-demo", help="the wire protocol in memory: handshake, fragments"
    )
    wire.add_argument(
        "--encryption", choices=[m.name.lower() for m in EncryptionMode], default="required"
    )
    wire.set_defaults(func=_wire_demo)

    from brokerd.analytics.service import DEFAULT_WARM_UPS, MAX_TOP

    analyze = commands.add_parser(
        "analyze",
        help="PySpark jobs over delivery traces: latency, faults, the exactly-once audit",
    )
    analyze.add_argument(
        "paths", nargs="+", type=Path, metavar="TRACE_DIR", help="trace directories or segments"
    )
    analyze.add_argument("--out", type=Path, default=Path("report"), help="report directory")
    analyze.add_argument("--master", help="Spark master (default local[*]: this machine's cores)")
    analyze.add_argument(
        "--top", type=_top, default=50, help=f"rows kept per table (1 to {MAX_TOP:,})"
    )
    analyze.add_argument("--quiet", action="store_true", help="no progress lines")
    analyze.add_argument(
        "--database",
        type=Path,
        action="append",
        default=[],
        help="a stopped daemon's database file, a witness of what it sent and delivered "
        "(repeat for each)",
    )
    analyze.add_argument(
        "--server",
        type=Path,
        metavar="SOCKET",
        help="ask the running analyzer listening at SOCKET (brokerd analyzer) instead of "
        "starting Spark",
    )
    analyze.set_defaults(func=_analyze)

    analyzer = commands.add_parser(
        "analyzer",
        help="keep Spark running, warmed up, for 'brokerd analyze --server SOCKET'",
    )
    analyzer.add_argument(
        "socket", type=Path, metavar="SOCKET", help="the Unix socket to listen at"
    )
    analyzer.add_argument("--master", help="Spark master (default local[*]: this machine's cores)")
    analyzer.add_argument(
        "--warm-up",
        type=int,
        default=DEFAULT_WARM_UPS,
        metavar="N",
        help=f"analyses of a generated trace set before listening (default {DEFAULT_WARM_UPS})",
    )
    analyzer.set_defaults(func=_analyzer)

    cluster = commands.add_parser(
        "cluster",
        help="the local cluster: an initiator, a forwarding hub, a load-balanced target "
        "pair and a mirrored pair, each a daemon on its own 127.0.0.x:4022",
    )
    cluster.add_argument("action", choices=("up", "down", "status"))
    cluster.add_argument(
        "dir",
        nargs="?",
        type=Path,
        default=Path("cluster"),
        help="certificates, configurations, data, logs and cluster.json (default ./cluster)",
    )
    cluster.add_argument(
        "--first-address",
        default="127.0.0.1",
        help="up: the first broker's loopback address; the others take the next ones",
    )
    cluster.set_defaults(func=_cluster)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except (BrokerError, OSError, ValueError) as exc:
        print(f"brokerd: error: {exc}", file=sys.stderr)
        return 2
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
