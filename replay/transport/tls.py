"""TLS for a replay: a throw-away CA and a server certificate made for the run.

``generate_tls_files(directory, hosts=[...])`` writes into ``directory``:

- ``ca.pem``: a self-signed CA certificate (clients trust only this);
- ``server.pem`` / ``server.key``: a certificate signed by that CA whose
  subject alternative names are every address the servers are reached by
  (IP addresses as IP SANs, names as DNS SANs; ``localhost``, ``127.0.0.1``
  and ``::1`` always included), and its private key (mode 0600).

Keys are ECDSA P-256 (fast to make, and what TLS 1.3 prefers).  Certificates
are valid from 5 minutes before creation (clock skew between hosts) for
``valid_days``.  All ps servers of a run share one certificate, so one
directory can be copied to (or shared by) every host of the run.

The CA's private key is not kept: nothing can be signed by it after the run.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tf_grpc_bench.errors import ConfigError, UsageError

CA_CERT = "ca.pem"
SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
#: Always in the server certificate, so loopback runs need no host list.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_VALID_DAYS = 7
_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """Paths of a run's CA certificate and server certificate/key (PEM)."""

    ca_cert_path: Path
    server_cert_path: Path
    server_key_path: Path

    @classmethod
    def in_directory(cls, directory: Path) -> TlsFiles:
        return cls(
            ca_cert_path=directory / CA_CERT,
            server_cert_path=directory / SERVER_CERT,
            server_key_path=directory / SERVER_KEY,
        )

    def _read(self, path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as error:
            raise ConfigError(f"{path}: cannot read TLS file ({error.strerror})") from None

    def ca_cert_pem(self) -> bytes:
        return self._read(self.ca_cert_path)

    def server_cert_pem(self) -> bytes:
        return self._read(self.server_cert_path)

    def server_key_pem(self) -> bytes:
        return self._read(self.server_key_path)

    def server_hosts(self) -> tuple[str, ...]:
        """The names and addresses the server certificate is valid for."""
        return certificate_hosts(self.server_cert_pem(), source=str(self.server_cert_path))


def _subject_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in (*LOOPBACK_HOSTS, *hosts):
        host = host.strip().strip("[]")
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if any(c.isspace() or c in "/:" for c in host):
                raise ConfigError(f"TLS host {host!r}: not an IP address or DNS name") from None
            names.append(x509.DNSName(host))
    return names


def generate_tls_files(
    directory: Path,
    *,
    hosts: Sequence[str] = (),
    valid_days: int = DEFAULT_VALID_DAYS,
) -> TlsFiles:
    """Make a CA and a server certificate for ``hosts`` (host names or IPs, no ports).

    Overwrites existing files of the same names.  Blocking (file writes).
    """
    if valid_days <= 0:
        raise ConfigError(f"TLS certificate validity must be > 0 days, got {valid_days}")
    names = _subject_names(hosts)
    now = datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - _SKEW, now + datetime.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tf-grpc-bench run CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tf-grpc-bench server")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles.in_directory(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        files.ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        files.server_cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
        key_pem = server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        descriptor = os.open(files.server_key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(key_pem)
    except OSError as error:
        raise ConfigError(f"{directory}: cannot write TLS files ({error.strerror})") from None
    return files


def load_tls_files(directory: Path) -> TlsFiles:
    """The TLS files of an earlier ``generate_tls_files`` (copied to this host, say)."""
    files = TlsFiles.in_directory(directory)
    for path in (files.ca_cert_path, files.server_cert_path, files.server_key_path):
        if not path.is_file():
            raise ConfigError(f"{path}: TLS file missing (generate with --tls on the serving side)")
    return files


def ensure_tls_files(directory: Path, *, hosts: Sequence[str] = ()) -> TlsFiles:
    """The files in ``directory`` if their certificate covers ``hosts``, else new ones.

    Safe when several processes of one run (ps tasks, workers) call it at
    once on the same directory: an exclusive lock on ``directory/.lock``
    makes one of them generate and the others reuse.
    """
    files = TlsFiles.in_directory(directory)
    wanted = {h.strip().strip("[]") for h in hosts if h.strip()}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / ".lock", "a")  # noqa: SIM115 - held across the block below
    except OSError as error:
        raise ConfigError(f"{directory}: cannot use as TLS directory ({error.strerror})") from None
    with lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        paths = (files.ca_cert_path, files.server_cert_path, files.server_key_path)
        if all(p.is_file() for p in paths) and wanted <= set(files.server_hosts()):
            return files
        return generate_tls_files(directory, hosts=hosts)


def certificate_hosts(cert_pem: bytes, *, source: str = "certificate") -> tuple[str, ...]:
    """The subject alternative names (DNS names and IPs) of a PEM certificate."""
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound) as error:
        raise ConfigError(
            f"{source}: not a certificate with subject alternative names ({error})"
        ) from None
    dns = names.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    return (*dns, *ips)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Credentials for ``server.add_secure_port``: the run's server certificate."""
    return grpc.ssl_server_credentials([(files.server_key_pem(), files.server_cert_pem())])


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Credentials for ``grpc.secure_channel``: trust the run's CA and nothing else."""
    return grpc.ssl_channel_credentials(root_certificates=files.ca_cert_pem())


def material(files: TlsFiles) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, server certificate, server key) of ``files``, PEM."""
    return files.ca_cert_pem(), files.server_cert_pem(), files.server_key_pem()


def ensure_material(
    directory: Path | None, *, hosts: Sequence[str] = ()
) -> tuple[bytes, bytes, bytes]:
    """The TLS material for ``--tls``, made or reused in ``directory``.

    Raises ``UsageError`` when there is no directory to keep it in.
    """
    if directory is None:
        raise UsageError("--tls needs --tls-dir DIR (where the CA and server certificate are)")
    return material(ensure_tls_files(directory, hosts=hosts))
