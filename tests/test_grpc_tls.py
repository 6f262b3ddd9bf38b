"""gRPC over TLS, end to end with real service processes: the job API and the drafter service serve
TLS with a certificate, clients verify it against the CA and carry the bearer token; plaintext
clients, clients trusting another CA and wrong tokens are refused."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tlt.jobs.client import JobClient
from tlt.local.process import GrpcServiceProcess
from tlt.rpc.service import bearer_metadata, client_channel
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc, jobs_pb2


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for localhost / 127.0.0.1 that is its own CA: (certificate, key) PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_file, key_file


def _refused(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        fn()
    return caught.value.code()


def test_tls_and_tokens_end_to_end(redis_server, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path, "tlt")
    other_ca, _ = _self_signed(tmp_path, "someone-else")
    env = {**redis_server.client_env(), "TLT_TRAINER_AUTH_TOKEN": "t0ken", "TLT_DRAFTER_AUTH_TOKEN": "d-t0ken"}
    tls = ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    trainer = GrpcServiceProcess("trainer", tmp_path / "trainer.log", args=["--runs-dir", str(tmp_path / "runs"), *tls], env=env, tls_ca_file=cert)
    drafter = GrpcServiceProcess("drafter_service", tmp_path / "drafter.log", args=tls, env=env, tls_ca_file=cert)
    with trainer.start(120), drafter.start(120):
        with JobClient(trainer.target, "t0ken", tls_ca_file=cert) as client:
            assert isinstance(client.list(), list)  # TLS verified, token accepted
        with JobClient(trainer.target, "wrong", tls_ca_file=cert) as client:
            assert _refused(client.list) == grpc.StatusCode.UNAUTHENTICATED
        with JobClient(trainer.target, "t0ken") as plaintext:
            assert _refused(lambda: plaintext.stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=plaintext._metadata, timeout=5)) == grpc.StatusCode.UNAVAILABLE
        with JobClient(trainer.target, "t0ken", tls_ca_file=other_ca) as untrusting:
            assert _refused(lambda: untrusting.stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=untrusting._metadata, timeout=5)) == grpc.StatusCode.UNAVAILABLE
        with client_channel(drafter.target, cert) as channel:
            stub = drafter_pb2_grpc.DrafterServiceStub(channel)
            assert _refused(lambda: stub.GetDrafter(pb.DrafterRef(job_id="none"), metadata=bearer_metadata("d-t0ken"))) == grpc.StatusCode.NOT_FOUND
            assert _refused(lambda: stub.GetDrafter(pb.DrafterRef(job_id="none"), metadata=bearer_metadata("x"))) == grpc.StatusCode.UNAUTHENTICATED


def test_half_a_tls_configuration_is_refused(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from tlt.settings.trainer import TrainerSettings

    with pytest.raises(ValidationError, match="both --tls-cert-file and --tls-key-file"):
        TrainerSettings(tls_cert_file=tmp_path / "x.crt")
