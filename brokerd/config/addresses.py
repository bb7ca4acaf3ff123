"""Broker addresses: ``tcp://host:port`` parsed and written one way, whether a host
is a loopback or an unspecified (any-interface) address, and whether two hosts are one."""

from __future__ import annotations

import ipaddress
import re

_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")


def parse_tcp_address(address: str) -> tuple[str, int]:
    """``tcp://host:port`` -> ``(host, port)``; IPv6 hosts in brackets (``tcp://[::1]:4022``).

    The scheme is case-insensitive; nothing may follow the port but one ``/`` (as the
    Service Broker documentation writes addresses). Raises ValueError with a readable reason.
    """
    if address[:6].lower() != "tcp://":
        raise ValueError(f"'{address}' is not of the form tcp://host:port")
    rest = address[6:]
    if rest.endswith("/"):
        rest = rest[:-1]
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise ValueError(f"'{address}': unclosed '[' around an IPv6 address")
        host, after = rest[1:end], rest[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"'{address}': '{host}' is not an IPv6 address") from None
        if not after.startswith(":"):
            raise ValueError(f"'{address}' has no port (tcp://host:port)")
        port_text = after[1:]
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise ValueError(f"'{address}' has no port (tcp://host:port)")
        if not host:
            raise ValueError(f"'{address}' has no host (tcp://host:port)")
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(
                f"'{address}': host '{host}' is not a host name or address "
                "(IPv6 addresses go in brackets; no paths or user names)"
            )
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"'{address}': port '{port_text}' is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"'{address}': port {port} is not between 1 and 65535")
    return host, port


def normal_tcp_address(address: str) -> str:
    """The one spelling of an address: ``tcp://host:port`` (``tcp://[v6]:port``), the host
    in lower case (a host name is compared without regard to case, as DNS does); ValueError."""
    host, port = parse_tcp_address(address)
    host = host.lower()
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def is_ip_address(host: str) -> bool:
    """Whether ``host`` is an IP address (v4 or v6), not a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def same_host(one: str, other: str) -> bool:
    """Whether two hosts name one address: a host name is compared without regard to case,
    ``localhost`` is 127.0.0.1 and ::1, an IP address in any spelling is itself."""
    return bool(_addresses(one) & _addresses(other))


def _addresses(host: str) -> set[str]:
    host = host.lower()
    if host == "localhost":
        return {"127.0.0.1", "::1"}
    try:
        return {ipaddress.ip_address(host).compressed}
    except ValueError:
        return {host}
