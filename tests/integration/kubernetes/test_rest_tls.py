"""The small Kubernetes client over real TLS: an EKS endpoint is HTTPS under the cluster's own CA, which the
configuration or DescribeCluster hands over as base64 of the PEM bundle (issue 17).

The local Kubernetes API speaks plain HTTP, so a minimal HTTPS server stands in here: a certificate for
`localhost` issued by a CA made for the test. What is under test is the trust the client places, not the
API's semantics (those are `test_rest_client.py`'s).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.eks_token import ClusterAccess, eks_api_client
from gpu_autoscaler.adapters.kubernetes.rest import KubernetesHttpError, KubernetesRest
from gpu_autoscaler.errors import KubernetesApiError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from gpu_autoscaler.config import Config

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _certificate(subject: str, issuer_key: Any, key: Any, issuer: str, *, ca: bool) -> Any:
    now = datetime.now(UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: Any) -> str:
    text: str = certificate.public_bytes(serialization.Encoding.PEM).decode()
    return text


class _NodeList(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        seen = self.headers.get("Authorization") or ""
        body = json.dumps({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [],
                           "authorization": seen}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        return


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(URL of an HTTPS server for `localhost`, the PEM of the CA that issued its certificate)."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test cluster CA", ca_key, ca_key, "test cluster CA", ca=True)
    served = _certificate("localhost", ca_key, key, "test cluster CA", ca=False)
    directory: Path = tmp_path_factory.mktemp("tls")
    (directory / "server.pem").write_text(_pem(served))
    (directory / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "server.pem", directory / "server.key")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NodeList)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://localhost:{server.server_address[1]}", _pem(ca)
    server.shutdown()
    server.server_close()


def test_the_clusters_ca_is_trusted_and_only_it(https: tuple[str, str]) -> None:
    url, ca = https
    with KubernetesRest(url, ca_pem=ca, authorization=lambda: "Bearer t") as trusting:
        answer = trusting.get("/api/v1/nodes")
    assert answer["kind"] == "NodeList" and answer["authorization"] == "Bearer t"
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _pem(_certificate("another CA", other_key, other_key, "another CA", ca=True))
    for client in (KubernetesRest(url, ca_pem=other), KubernetesRest(url)):  # another CA; the system's
        with client, pytest.raises(KubernetesApiError) as refused:
            client.get("/api/v1/nodes")
        assert refused.value.status is None and not isinstance(refused.value, KubernetesHttpError)
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)


def test_the_eks_client_trusts_the_base64_ca_of_the_cluster(https: tuple[str, str], config: Config,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    url, ca = https

    # Only STS is asked for, to presign the token locally with made-up credentials: no call leaves the machine.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    access = ClusterAccess(url, base64.b64encode(ca.encode()).decode())
    with eks_api_client(config, AwsClients("us-east-1"), access=access) as api:
        answer = api.get("/api/v1/nodes")
    assert answer["authorization"].startswith("Bearer k8s-aws-v1.")
