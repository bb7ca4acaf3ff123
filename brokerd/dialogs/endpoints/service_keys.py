"""Service key pairs and remote service bindings of one database (SPEC R-DLG-14).

The configuration names the files (``[[database.service]] certificate``,
``private_key``, ``dialog_security``; ``[[database.remote_service_binding]]``);
:meth:`ServiceKeys.load` reads them when the database opens, and the engine asks
this object whether a dialog is secured and with which keys:

* a dialog is secured when its local service requires dialog security, or when the
  far service has a remote service binding here (as SQL Server secures a dialog
  whose target has a REMOTE SERVICE BINDING);
* securing it needs the local service's private key and the far service's
  certificate (``plan``); a missing one is the reason BEGIN DIALOG, or the target's
  acceptance of the first message, is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from brokerd.config import DatabaseConfig
from brokerd.errors import ConfigError


def _read(path: Path, what: str, database: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(path, f"database {database}", f"cannot read the {what}: {exc}") from None


def _p256_public(cert_pem: bytes, path: Path, database: str) -> ec.EllipticCurvePublicKey:
    try:
        public = x509.load_pem_x509_certificate(cert_pem).public_key()
    except ValueError as exc:
        raise ConfigError(path, f"database {database}", f"not a certificate: {exc}") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or not isinstance(
        public.curve, ec.SECP256R1
    ):
        raise ConfigError(
            path,
            f"database {database}",
            "dialog security needs an EC P-256 key (brokerd certs service NAME)",
        )
    return public


@dataclass
class ServiceKeys:
    own: dict[str, ec.EllipticCurvePrivateKey] = field(default_factory=dict)
    """Local services with a key pair."""
    required: frozenset[str] = frozenset()
    """Local services whose dialogs must all be secured."""
    bound: dict[str, ec.EllipticCurvePublicKey] = field(default_factory=dict)
    """Far services with a remote service binding: their public keys."""

    @classmethod
    def load(cls, config: DatabaseConfig) -> ServiceKeys:
        keys = cls()
        database = config.name
        for service in config.services:
            if service.certificate is None or service.private_key is None:
                continue
            public = _p256_public(
                _read(service.certificate, "certificate", database), service.certificate, database
            )
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
        keys.required = frozenset(s.name for s in config.services if s.dialog_security)
        for binding in config.remote_service_bindings:
            keys.bound[binding.service] = _p256_public(
                _read(binding.certificate, "certificate", database), binding.certificate, database
            )
        return keys

    def secured(self, service: str, far_service: str) -> bool:
        """Whether a dialog of local ``service`` with ``far_service`` is secured."""
        return service in self.required or far_service in self.bound

    def plan(self, service: str, far_service: str) -> str | None:
        """Why a secured dialog of ``service`` with ``far_service`` cannot be secured here."""
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
        return None


def new_dialog_key() -> bytes:
    """A random 32-byte dialog key."""
    return os.urandom(32)
