"""TLS on the gRPC services and the admin API, through a cluster of real processes."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from emberfs.cli.admin import AdminClient, AdminError
from emberfs.client.fs import EmberFileSystem
from emberfs.common.grpcauth import TLSFiles


def self_signed(directory) -> TLSFiles:
    """A certificate for 127.0.0.1 and localhost that is its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "emberfs test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return TLSFiles(cert=str(cert_path), key=str(key_path), ca=str(cert_path))


def test_grpc_and_the_admin_api_speak_tls(private_cluster, tmp_path):
    tls = self_signed(tmp_path)
    cluster = private_cluster(tls=tls)  # storage servers register and heartbeat over TLS
    assert cluster.admin_url.startswith("https://")
    fs = EmberFileSystem(cluster.meta_address, tls_ca=tls.ca, skip_instance_cache=True)
    try:
        fs.pipe_file("/tls.bin", b"over tls" * 100_000)
        assert fs.cat_file("/tls.bin") == b"over tls" * 100_000
    finally:
        fs.close()
    # a client that does not speak TLS does not get in
    plain = EmberFileSystem(cluster.meta_address, skip_instance_cache=True, retry_timeout=2.0)
    try:
        with pytest.raises(OSError):
            plain.ls("/")
    finally:
        plain.close()
    admin = AdminClient(cluster.admin_url, cluster.admin_token, tls_ca=tls.ca)
    assert admin.get("/api/v1/cluster")
    assert admin.get("/api/v1/tokens")["tokens"] == []
    with pytest.raises(AdminError):  # the certificate is not one the system trusts
        AdminClient(cluster.admin_url, cluster.admin_token).get("/api/v1/cluster")
    with pytest.raises(AdminError):
        AdminClient(cluster.admin_url.replace("https", "http"), cluster.admin_token).get(
            "/api/v1/cluster"
        )
