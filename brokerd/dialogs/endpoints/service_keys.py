"""Service key pairs and remote service bindings of one database (SPEC R-DLG-14).

The configuration names the files (``[[database.service]] certificate``,
``private_key``, ``dialog_security``; ``[[database.remote_service_binding]]``);
:meth:`ServiceKeys.load` reads them when the database opens, and the engine asks
this object whether a dialog is secured and with which keys:

* a dialog is secured when its local service requires dialog security, or when the
  far service has a remote service binding here (as SQL Server secures a dialog
  whose target has a REMOTE SERVICE BINDING);
* securing it needs the local service's private key and the far service's
  certificate, both valid now (``plan``); a missing or expired one is the reason BEGIN
  DIALOG, or the target's acceptance of the first message, is refused.

A certificate speaks for the service its subject common name names (``brokerd certs
service NAME``): a service's own certificate, or a binding's, issued to another service
is a configuration error, and so is one that the deployment CA did not issue, when the
caller gives the CA.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from brokerd.config import DatabaseConfig
from brokerd.errors import ConfigError


def _read(path: Path, what: str, database: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(path, f"database {database}", f"cannot read the {what}: {exc}") from None


class _Certificate:
    """A service certificate as dialog security uses it: its P-256 key and validity."""

    __slots__ = ("not_after", "not_before", "path", "public")

    def __init__(
        self, cert: x509.Certificate, public: ec.EllipticCurvePublicKey, path: Path
    ) -> None:
        self.public = public
        self.not_before = cert.not_valid_before_utc
        self.not_after = cert.not_valid_after_utc
        self.path = path

    def problem(self, service: str, now: dt.datetime) -> str | None:
        """Why the certificate of ``service`` cannot secure a new dialog at ``now``."""
        if now < self.not_before:
            return (
                f"the certificate of {service!r} ({self.path}) is not valid before "
                f"{self.not_before:%Y-%m-%d %H:%M:%S} UTC"
            )
        if now > self.not_after:
            return (
                f"the certificate of {service!r} ({self.path}) expired on "
                f"{self.not_after:%Y-%m-%d %H:%M:%S} UTC (brokerd certs service NAME)"
            )
        return None


def _subject_name(cert: x509.Certificate) -> str | None:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        return None
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _service_certificate(
    cert_pem: bytes,
    path: Path,
    database: str,
    service: str,
    cas: Sequence[x509.Certificate],
) -> _Certificate:
    """The certificate of ``service`` in ``path``: EC P-256, issued to that service (its
    subject common name), and by one of ``cas`` when they are given."""
    where = f"database {database}: service {service}"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        public = cert.public_key()
        subject = _subject_name(cert)
    except ValueError as exc:
        raise ConfigError(path, where, f"not a certificate: {exc}") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or not isinstance(
        public.curve, ec.SECP256R1
    ):
        raise ConfigError(
            path, where, "dialog security needs an EC P-256 key (brokerd certs service NAME)"
        )
    if subject != service:
        raise ConfigError(
            path,
            where,
            f"is the certificate of {subject!r}, not of {service!r} (its subject common name "
            "is the service it speaks for; brokerd certs service NAME)",
        )
    if cas and not any(_issued_by(cert, ca) for ca in cas):
        raise ConfigError(
            path,
            where,
            f"was not issued by the deployment CA (its issuer is {cert.issuer.rfc4514_string()})",
        )
    return _Certificate(cert, public, path)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


@dataclass
class ServiceKeys:
    own: dict[str, ec.EllipticCurvePrivateKey] = field(default_factory=dict)
    """Local services with a key pair."""
    required: frozenset[str] = frozenset()
    """Local services whose dialogs must all be secured."""
    bound: dict[str, ec.EllipticCurvePublicKey] = field(default_factory=dict)
    """Far services with a remote service binding: their public keys."""
    certificates: dict[tuple[bool, str], _Certificate] = field(default_factory=dict)
    """The certificates behind ``own`` (key (True, service)) and ``bound`` ((False,
    service)): their validity is checked when a dialog is secured."""

    @classmethod
    def load(cls, config: DatabaseConfig, cas: Sequence[x509.Certificate] = ()) -> ServiceKeys:
        """The key pairs and bindings ``config`` names; ``cas``: the deployment CA's
        certificates, which must have issued every one of them (not checked without)."""
        keys = cls()
        database = config.name
        for service in config.services:
            if service.certificate is None or service.private_key is None:
                continue
            own = _service_certificate(
                _read(service.certificate, "certificate", database),
                service.certificate,
                database,
                service.name,
                cas,
            )
            public = own.public
            try:
                private = serialization.load_pem_private_key(
                    _read(service.private_key, "private key", database), password=None
                )
            except ValueError as exc:
                raise ConfigError(
                    service.private_key, f"database {database}", f"not a private key: {exc}"
                ) from None
            if not isinstance(private, ec.EllipticCurvePrivateKey) or private.public_key() != (
                public
            ):
                raise ConfigError(
                    service.private_key,
                    f"database {database}: service {service.name}",
                    f"is not the private key of {service.certificate}",
                )
            keys.own[service.name] = private
            keys.certificates[True, service.name] = own
        keys.required = frozenset(s.name for s in config.services if s.dialog_security)
        for binding in config.remote_service_bindings:
            far = _service_certificate(
                _read(binding.certificate, "certificate", database),
                binding.certificate,
                database,
                binding.service,
                cas,
            )
            keys.bound[binding.service] = far.public
            keys.certificates[False, binding.service] = far
        return keys

    def secured(self, service: str, far_service: str) -> bool:
        """Whether a dialog of local ``service`` with ``far_service`` is secured."""
        return service in self.required or far_service in self.bound

    def plan(self, service: str, far_service: str, now: dt.datetime | None = None) -> str | None:
        """Why a secured dialog of ``service`` with ``far_service`` cannot be secured here
        (at ``now``, by default the current time): a key pair or binding missing, or a
        certificate of either not valid."""
        if service not in self.own:
            return (
                f"service {service!r} has no key pair (set its certificate and private_key; "
                "brokerd certs service NAME)"
            )
        if far_service not in self.bound:
            return (
                f"there is no remote service binding for {far_service!r} (its certificate; "
                "[[database.remote_service_binding]])"
            )
        now = now or dt.datetime.now(dt.UTC)
        for own, name in ((True, service), (False, far_service)):
            cert = self.certificates.get((own, name))
            problem = cert.problem(name, now) if cert is not None else None
            if problem is not None:
                return problem
        return None


def new_dialog_key() -> bytes:
    """A random 32-byte dialog key."""
    return os.urandom(32)
