"""Print, as Markdown, what ``brokerctl explain`` says about the worked routing examples.

    .venv/bin/python docs/explain_routing_examples.py [--output FILE]

For each example (and the forwarding-off variants of examples 6 and 7) this
starts the example's daemons (``tests/routing/worked_examples.py``) in a temporary directory,
on 127.0.0.31-34 port 4022, and runs ``brokerctl --config aw/brokerd.toml
explain SERVICE --database AdventureWorks`` (or ``--from-outside``) on the "aw"
broker, which holds AdventureWorks and msdb with the example's route tables.
Commands run with the deployment directory as working directory, so they are
printed exactly as run. Every daemon is stopped at the end, also on error.

The exit status is 1 if a decision differs from the one the example describes
(the expectation is printed above each command), 0 otherwise.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from brokerd.tools.launcher import Deployment  # noqa: E402
from tests.routing import worked_examples as s  # noqa: E402
from tests.routing.deploy import AW, RETRY, R  # noqa: E402

BROKERCTL = ROOT / ".venv" / "bin" / "brokerctl"
NULL = "NULL"

VARIANTS: list[tuple[str, Callable[[Deployment], s.Example]]] = [
    ("1", s.example_1),
    ("2", s.example_2),
    ("3", s.example_3),
    ("4", s.example_4),
    ("5", s.example_5),
    ("6", s.example_6),
    ("6", lambda d: s.example_6(d, forwarding=False)),
    ("7", s.example_7),
    ("7", lambda d: s.example_7(d, forwarding=False)),
]


def route_table(title: str, routes: tuple[R, ...], doc_name: dict[str, str]) -> list[str]:
    """The documentation's table layout; AutoCreatedLocal first (R-OBJ-6)."""

    def address(value: str | None) -> str:
        if value is None:
            return NULL
        for host, name in doc_name.items():
            if f"//{host}:" in value:
                return f"`{value.replace(host, name)}` (`{value}`)"
        return f"`{value}`"

    lines = [
        f"**{title}**",
        "",
        "| name | remote_service_name | broker_instance | address | mirror_address |",
        "| --- | --- | --- | --- | --- |",
        f"| AutoCreatedLocal | {NULL} | {NULL} | LOCAL | {NULL} |",
    ]
    for r in routes:
        lines.append(
            f"| {r.name} | {r.service or NULL} | {r.broker_instance or NULL} "
            f"| {address(r.address)} | {address(r.mirror_address)} |"
        )
    return [*lines, ""]


def explain_command(case: s.Case) -> list[str]:
    args = ["explain", case.service]
    args += ["--from-outside"] if case.from_outside else ["--database", AW]
    if case.broker_instance is not None:
        args += ["--broker-instance", str(case.broker_instance)]
    return args


def run_ctl(root: Path, args: list[str]) -> tuple[str, str]:
    """Run brokerctl against aw; (the command as printed, its output)."""
    argv = ["--config", "aw/brokerd.toml", *args]
    shown = "brokerctl " + shlex.join(argv)
    result = subprocess.run(
        [str(BROKERCTL), *argv], cwd=root, capture_output=True, text=True, timeout=60
    )
    output = (result.stdout + result.stderr).rstrip()
    if result.returncode != 0:
        output += f"\n(exit status {result.returncode})"
    return shown, output


def document(label: str, make: Callable[[Deployment], s.Example], root: Path) -> tuple[str, int]:
    """One example's Markdown and the number of decisions that differ from the example's."""
    deployment = Deployment(root, RETRY)
    out: list[str] = []
    mismatches = 0
    try:
        example = make(deployment)
        for name in example.daemons:
            deployment.start(name)
        out += [f"## Example {label}: {example.title}", ""]
        hosts = {name: deployment.daemons[name].host for name in example.daemons}
        doc_name = {hosts[d]: doc for d, doc in example.doc_hosts.items()}
        forwarding = "on" if example.forwarding else "off"
        out.append(
            f"- `aw` on {hosts['aw']}: AdventureWorks and msdb, message forwarding {forwarding}"
        )
        for name, doc in example.doc_hosts.items():
            out.append(f"- `{name}` on {hosts[name]}: stands for {doc}")
        out += [
            f"- `outside` on {hosts['outside']}: begins the conversations that arrive from "
            "outside (`--from-outside`)",
            "",
        ]
        out += route_table("AdventureWorks.sys.routes", example.aw_routes, doc_name)
        out += route_table("msdb.sys.routes", example.msdb_routes, doc_name)
        shown, output = run_ctl(root, ["routes"])
        out += [f"`{shown}`", "", "```text", output, "```", ""]
        for case in example.cases:
            shown, output = run_ctl(root, explain_command(case))
            decided = [line for line in output.splitlines() if line.startswith("decision:")]
            ok = bool(decided) and decided[-1].startswith(f"decision: {case.expected.upper()}")
            if not ok:
                mismatches += 1
                print(
                    f"example {label}: {shown}: expected {case.expected.upper()}, got "
                    f"{decided[-1] if decided else output!r}",
                    file=sys.stderr,
                )
            expected = f"Expected (worked example): **{case.expected.upper()}**, {case.what}."
            if not ok:
                expected += " **(differs)**"
            out += [f"`{shown}`", "", expected, "", "```text", output, "```", ""]
    finally:
        deployment.stop_all()
    return "\n".join(out), mismatches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", "-o", type=Path, help="write the Markdown here (not stdout)")
    args = parser.parse_args()
    if not BROKERCTL.exists():
        parser.error(f"{BROKERCTL} not found (install the project into .venv first)")
    parts = [
        "# The worked routing examples: `brokerctl explain` on the AdventureWorks broker",
        "",
        "Generated by `.venv/bin/python docs/explain_routing_examples.py`. The documentation's "
        "`tcp://<name>.Adventure-Works.com:4022/` addresses are mapped to loopback "
        "addresses; `//AW/Initiator` and `LocalService` are services of AdventureWorks, "
        "`MissingService` exists nowhere. Conversations begun in AdventureWorks are "
        "DELAYED, never dropped, when no route can deliver them (R-ROUTE-13, also in "
        "example 1); messages from outside with no route are dropped and not acknowledged.",
        "",
    ]
    mismatches = 0
    for label, make in VARIANTS:
        with tempfile.TemporaryDirectory(prefix="seed004-") as tmp:
            text, bad = document(label, make, Path(tmp))
        parts.append(text)
        mismatches += bad
    markdown = "\n".join(parts).rstrip() + "\n"
    if args.output:
        args.output.write_text(markdown)
    else:
        sys.stdout.write(markdown)
    if mismatches:
        print(f"{mismatches} decision(s) differ from the worked examples", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
