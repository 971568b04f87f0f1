"""The one place every Kafka client takes its connection from: settings, checks, arguments."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from loraplane.gateway.settings import GatewaySettings
from loraplane.shared.kafka_client import KafkaConfigError, KafkaConnection
from loraplane.shared.settings import CommonSettings
from loraplane.stack.certs import CertFiles, ensure_dev_pki


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, CertFiles]:
    return ensure_dev_pki(tmp_path / "pki", ("tansu", "gateway", "worker"))


def test_plaintext_by_default_and_the_arguments_carry_only_the_servers() -> None:
    kafka = CommonSettings(kafka_bootstrap="k:9092").kafka()
    assert kafka == KafkaConnection("k:9092")
    assert kafka.client_args() == {"bootstrap_servers": "k:9092",
                                   "security_protocol": "PLAINTEXT"}


def test_mutual_tls_from_the_environment_in_every_service(
        pki: dict[str, CertFiles], monkeypatch: pytest.MonkeyPatch) -> None:
    files = pki["worker"]
    monkeypatch.setenv("LORAPLANE_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("LORAPLANE_KAFKA_CA_FILE", str(files.ca))
    monkeypatch.setenv("LORAPLANE_KAFKA_CERT_FILE", str(files.cert))
    monkeypatch.setenv("LORAPLANE_KAFKA_KEY_FILE", str(files.key))
    # the gateway's own prefix (LORAPLANE_GATEWAY_) does not hide the shared names
    for settings in (CommonSettings(), GatewaySettings()):
        args = settings.kafka().client_args()
        assert args["security_protocol"] == "SSL"
        ctx = args["ssl_context"]
        assert isinstance(ctx, ssl.SSLContext)
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        assert "sasl_plain_password" not in args
    first, second = (CommonSettings().kafka().client_args()["ssl_context"] for _ in range(2))
    assert first is not second  # read anew per client: a rotation is seen by new clients


def test_sasl_ssl_login_and_the_password_stays_out_of_reprs(
        pki: dict[str, CertFiles]) -> None:
    settings = CommonSettings(kafka_security_protocol="SASL_SSL",
                              kafka_ca_file=str(pki["tansu"].ca),
                              kafka_sasl_username="svc", kafka_sasl_password="s3cret-pw")
    kafka = settings.kafka()
    args = kafka.client_args()
    assert (args["sasl_mechanism"], args["sasl_plain_username"],
            args["sasl_plain_password"]) == ("SCRAM-SHA-512", "svc", "s3cret-pw")
    assert "s3cret-pw" not in repr(kafka) and "s3cret-pw" not in repr(settings)


def _problem(**fields: object) -> str:
    with pytest.raises(ValidationError) as info:
        CommonSettings(**fields)  # type: ignore[arg-type]
    return str(info.value)


def test_every_inconsistency_is_refused_at_start_naming_the_setting(
        pki: dict[str, CertFiles], tmp_path: Path) -> None:
    ca, cert = str(pki["tansu"].ca), str(pki["gateway"].cert)
    text = _problem(kafka_ca_file=ca, kafka_cert_file=cert)
    assert "LORAPLANE_KAFKA_CA_FILE is set but LORAPLANE_KAFKA_SECURITY_PROTOCOL is " \
           "PLAINTEXT" in text
    assert "LORAPLANE_KAFKA_CERT_FILE is set but" in text  # every problem, at once
    assert "LORAPLANE_KAFKA_CERT_FILE is set without LORAPLANE_KAFKA_KEY_FILE" in text

    missing = tmp_path / "nope.pem"
    assert f"LORAPLANE_KAFKA_CA_FILE={missing} cannot be read" in _problem(
        kafka_security_protocol="SSL", kafka_ca_file=str(missing))
    assert "SASL_SSL needs LORAPLANE_KAFKA_SASL_USERNAME" in _problem(
        kafka_security_protocol="SASL_SSL")
    assert "LORAPLANE_KAFKA_SASL_PASSWORD is set but LORAPLANE_KAFKA_SECURITY_PROTOCOL " \
           "is SSL" in _problem(kafka_security_protocol="SSL", kafka_sasl_password="x")

    # a key that is not the certificate's (a half-written rotation) is refused too
    text = _problem(kafka_security_protocol="SSL", kafka_ca_file=ca, kafka_cert_file=cert,
                    kafka_key_file=str(pki["worker"].key))
    assert "cannot load the Kafka TLS files" in text and "LORAPLANE_KAFKA_KEY_FILE" in text
    assert "PRIVATE KEY" not in text  # names the files, never their contents


def test_an_unknown_protocol_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAPLANE_KAFKA_SECURITY_PROTOCOL", "TLS")
    assert "LORAPLANE_KAFKA_SECURITY_PROTOCOL\n  Input should be 'PLAINTEXT', 'SSL' or " \
           "'SASL_SSL'" in _problem()


def test_check_raises_the_same_problems(pki: dict[str, CertFiles]) -> None:
    with pytest.raises(KafkaConfigError, match="needs both"):
        KafkaConnection("k:1", "SSL", key_file=str(pki["gateway"].key)).check()
    ok = KafkaConnection("k:1", "SSL", ca_file=str(pki["tansu"].ca))
    assert ok.check() is ok
