"""Deployment CA and instance certificates (``brokerd certs ...``).

A deployment has one CA; every broker instance gets a certificate whose subject
common name is its instance name, signed by that CA. Brokers refuse peers whose
certificate another CA issued (docs/design.md, security defaults).

Files written (PEM):
  ``ca.pem`` / ``ca.key``                 the deployment CA
  ``<instance>.pem`` / ``<instance>.key`` one instance (key file mode 0600)
  ``<stem>.pem`` / ``<stem>.key``         one service, for dialog security (R-DLG-14);
                                          the stem is the service name made a file name
                                          (:func:`service_stem`)
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from protocol.security import Identity

KEY_TYPES = ("ed25519", "ec-p256")


@dataclass(frozen=True)
class Issued:
    """A certificate with its private key, as PEM bytes."""

    certificate_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.certificate_pem)

    @property
    def private_key(self) -> ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
            raise ValueError(
                f"unsupported key type {type(key).__name__}; use {' or '.join(KEY_TYPES)}"
            )
        return key


def _new_key(key_type: str) -> ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey:
    if key_type == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if key_type == "ec-p256":
        return ec.generate_private_key(ec.SECP256R1())
    raise ValueError(f"unknown key type {key_type!r}; choose one of {', '.join(KEY_TYPES)}")


def _hash_for(key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> hashes.SHA256 | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _key_pem(key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def create_ca(
    name: str, days: int = 3650, key_type: str = "ed25519", now: dt.datetime | None = None
) -> Issued:
    """A self-signed deployment CA."""
    now = now or dt.datetime.now(dt.UTC)
    key = _new_key(key_type)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage("key_cert_sign", "crl_sign"),
            critical=True,
        )
        .sign(key, _hash_for(key))
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_instance(
    ca: Issued,
    instance_name: str,
    days: int = 825,
    key_type: str = "ed25519",
    now: dt.datetime | None = None,
    alt_names: Iterable[str] = (),
) -> Issued:
    """An instance certificate (subject CN = instance name) signed by the CA.

    ``alt_names`` are the host names and IP addresses clients reach the instance by
    (subject alternative names): a client connecting over TLS (``[client]
    tls_certificate``) checks the address it dialled against them."""
    if not instance_name or len(instance_name.encode("utf-8")) > 256:
        raise ValueError("instance name must be 1..256 bytes of UTF-8")
    now = now or dt.datetime.now(dt.UTC)
    key = _new_key(key_type)
    ca_cert, ca_key = ca.certificate, ca.private_key
    builder = x509.CertificateBuilder()
    names = subject_alt_names(alt_names)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = (
        builder.subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, instance_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, _hash_for(ca_key))
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_stem(service_name: str) -> str:
    """A file name stem for a service name: ``//shop/Client`` -> ``service-shop-Client``."""
    parts = re.split(r"[^A-Za-z0-9_.-]+", service_name)
    return "service-" + "-".join(p for p in parts if p).strip(".")


def issue_service(
    ca: Issued, service_name: str, days: int = 825, now: dt.datetime | None = None
) -> Issued:
    """A service certificate for dialog security (R-DLG-14): subject CN = the service name,
    an EC P-256 key (it signs the dialog key exchange and receives wrapped dialog keys)."""
    if not service_name or len(service_name.encode("utf-8")) > 256:
        raise ValueError("service name must be 1..256 bytes of UTF-8")
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    ca_cert, ca_key = ca.certificate, ca.private_key
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, service_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage("digital_signature", "key_agreement"),
            critical=True,
        )
        .sign(ca_key, _hash_for(ca_key))
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def subject_alt_names(values: Iterable[str]) -> list[x509.GeneralName]:
    """Each value as an IP address if it is one, else as a DNS name; duplicates once."""
    names: list[x509.GeneralName] = []
    for value in dict.fromkeys(values):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(value)))
        except ValueError:
            if not value or any(ch.isspace() for ch in value):
                raise ValueError(f"{value!r} is neither an IP address nor a host name") from None
            names.append(x509.DNSName(value))
    return names


def identity_for(issued: Issued, ca: Issued) -> Identity:
    """The protocol Identity of an instance certificate under a CA."""
    return Identity.from_pem(issued.certificate_pem, issued.key_pem, ca.certificate_pem)


def write_pair(directory: Path, stem: str, issued: Issued, overwrite: bool = False) -> list[Path]:
    """Write ``stem.pem`` and ``stem.key`` (0600); refuse to overwrite unless asked."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    for path in (cert_path, key_path):
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists (pass --force to overwrite)")
    cert_path.write_bytes(issued.certificate_pem)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an overwritten key keeps its old mode otherwise
    with os.fdopen(fd, "wb") as handle:
        handle.write(issued.key_pem)
    return [cert_path, key_path]


def read_pair(directory: Path, stem: str) -> Issued:
    return Issued(
        (directory / f"{stem}.pem").read_bytes(), (directory / f"{stem}.key").read_bytes()
    )


def load_identity(certificate: Path, key: Path, ca: Path) -> Identity:
    """Read an identity from PEM files (used by the daemon's configuration)."""
    return Identity.from_pem(certificate.read_bytes(), key.read_bytes(), ca.read_bytes())


_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


def _key_usage(*allowed: str) -> x509.KeyUsage:
    """A KeyUsage extension allowing exactly ``allowed`` (names of its flags)."""
    unknown = set(allowed) - set(_KEY_USAGES)
    assert not unknown, unknown
    return x509.KeyUsage(**{name: name in allowed for name in _KEY_USAGES})
