"""TLS for the local Kubernetes API server's kubeconfig: a cluster CA and a serving certificate for 127.0.0.1.

kubectl (client-go) sends a kubeconfig's credentials over TLS only: to a plain `http://` server it sends no
`Authorization` header at all (kubernetes/kubectl#744), so an authorizing server would see it as
`system:anonymous`. A real API server is always HTTPS under the cluster's CA, which the kubeconfig carries
(`certificate-authority-data`). The local server serves both on one port: a connection that opens with a TLS
handshake is served over TLS with this certificate, any other as plain HTTP (the Python clients the tests, the agent
and the functions use, pointed at `LocalKubernetes.url`).
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["ServingCertificate", "serving_certificate"]


@dataclass(frozen=True)
class ServingCertificate:
    ca_pem: bytes
    context: ssl.SSLContext


def serving_certificate(directory: Path, host: str) -> ServingCertificate:
    """A new CA (`<cluster>-ca`, a day long) and a certificate it issues for `host` and `localhost`; the key and
    certificate are written to `directory` (the kubeconfig's, mode 0600), as `ssl` loads them from files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.now(UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "local-kubernetes-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
          .not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    serving = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
               .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.SubjectAlternativeName(names), critical=False)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
               .sign(ca_key, hashes.SHA256()))
    certificate_path, key_path = directory / "apiserver.crt", directory / "apiserver.key"
    key_path.touch(mode=0o600)
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    certificate_path.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate_path, key_path)
    return ServingCertificate(ca.public_bytes(serialization.Encoding.PEM), context)
