"""The ``brokerd`` command line, run as a real subprocess: certificates and the demo."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path

from cryptography import x509

from brokerd.tools.certs import load_identity
from protocol import BrokerConnection, ConnectionSettings, Role
from tests.commands import brokerd
from tests.conftest import run_handshake


def test_certs_make_a_ca_and_instances_that_complete_a_handshake(tmp_path: Path) -> None:
    assert brokerd("certs", "ca", "--dir", str(tmp_path), "--name", "Test CA").returncode == 0
    for name in ("alpha", "beta"):
        done = brokerd("certs", "instance", name, "--dir", str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert f"{name}.pem" in done.stdout
        assert stat.S_IMODE(os.stat(tmp_path / f"{name}.key").st_mode) == 0o600
    ca = tmp_path / "ca.pem"
    alpha = load_identity(tmp_path / "alpha.pem", tmp_path / "alpha.key", ca)
    beta = load_identity(tmp_path / "beta.pem", tmp_path / "beta.key", ca)
    now = dt.datetime.now(dt.UTC)
    i = BrokerConnection(Role.INITIATOR, ConnectionSettings(alpha), now)
    a = BrokerConnection(Role.ACCEPTOR, ConnectionSettings(beta), now)
    i_events, a_events = run_handshake(i, a)
    assert i.peer_instance == "beta" and a.peer_instance == "alpha"
    assert i_events and a_events


def test_ecdsa_key_type(tmp_path: Path) -> None:
    assert brokerd("certs", "ca", "--dir", str(tmp_path), "--key-type", "ec-p256").returncode == 0
    done = brokerd("certs", "instance", "gamma", "--dir", str(tmp_path), "--key-type", "ec-p256")
    assert done.returncode == 0, done.stderr
    assert b"BEGIN PRIVATE KEY" in (tmp_path / "gamma.key").read_bytes()


def test_instance_certificates_name_the_hosts_clients_dial(tmp_path: Path) -> None:
    """``--san`` puts host names and addresses in the certificate, so a TLS client port
    (R-CLIENT-1) can reuse it and clients can check the host they dialled."""
    assert brokerd("certs", "ca", "--dir", str(tmp_path)).returncode == 0
    done = brokerd(
        "certs", "instance", "alpha", "--dir", str(tmp_path), "--san", "10.0.0.5", "--san", "a.lan"
    )
    assert done.returncode == 0, done.stderr
    cert = x509.load_pem_x509_certificate((tmp_path / "alpha.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    assert names.get_values_for_type(x509.DNSName) == ["a.lan"]
    bad = brokerd("certs", "instance", "beta", "--dir", str(tmp_path), "--san", "not a host")
    assert bad.returncode == 2 and "neither an IP address nor a host name" in bad.stderr


def test_instance_without_a_ca_is_a_clear_error(tmp_path: Path) -> None:
    done = brokerd("certs", "instance", "alpha", "--dir", str(tmp_path))
    assert done.returncode == 2
    assert "no CA in" in done.stderr and "brokerd certs ca" in done.stderr
    assert "Traceback" not in done.stderr


def test_existing_files_are_not_overwritten_without_force(tmp_path: Path) -> None:
    assert brokerd("certs", "ca", "--dir", str(tmp_path)).returncode == 0
    before = (tmp_path / "ca.pem").read_bytes()
    done = brokerd("certs", "ca", "--dir", str(tmp_path))
    assert done.returncode == 2 and "--force" in done.stderr
    assert (tmp_path / "ca.pem").read_bytes() == before
    (tmp_path / "ca.key").chmod(0o644)  # as an older brokerd, or a careless copy, left it
    assert brokerd("certs", "ca", "--dir", str(tmp_path), "--force").returncode == 0
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600
    assert (tmp_path / "ca.pem").read_bytes() != before


def test_demo_runs_end_to_end() -> None:
    done = brokerd("wire-demo")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "HandshakeComplete(peer_instance='alpha'" in out
    assert "message 2 complete, 204800 bytes" in out
    assert "IntegrityFailure" in out
    assert "not issued by a trusted CA" in out
    assert "3 messages delivered intact=True" in out


def test_demo_signed_only() -> None:
    done = brokerd("wire-demo", "--encryption", "disabled")
    assert done.returncode == 0, done.stderr
    assert "encrypted=False" in done.stdout and "FRAGMENT#2" in done.stdout
    assert "encrypted+signed" not in done.stdout.split("alpha sends")[1].split("a broker whose")[0]


def test_a_ca_key_of_another_type_is_a_clear_error(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    assert brokerd("certs", "ca", "--dir", str(tmp_path)).returncode == 0
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "ca.key").write_bytes(
        rsa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    done = brokerd("certs", "instance", "alpha", "--dir", str(tmp_path))
    assert done.returncode == 2 and "unsupported key type" in done.stderr
    assert not (tmp_path / "alpha.pem").exists()


def test_certs_service_issues_an_ec_p256_service_certificate(tmp_path: Path) -> None:
    """R-DLG-14: a service certificate, its CN the service name, from the deployment CA."""
    from cryptography.hazmat.primitives.asymmetric import ec

    assert brokerd("certs", "ca", "--dir", str(tmp_path)).returncode == 0
    done = brokerd("certs", "service", "//shop/Client", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    cert = x509.load_pem_x509_certificate((tmp_path / "service-shop-Client.pem").read_bytes())
    assert cert.subject.rfc4514_string() == "CN=//shop/Client"
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    cert.verify_directly_issued_by(ca)
    assert stat.S_IMODE(os.stat(tmp_path / "service-shop-Client.key").st_mode) == 0o600
