"""N2: the email receiver against a real SMTP server (aiosmtpd on loopback)."""

from __future__ import annotations

import email
import email.policy
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("aiosmtpd", reason="aiosmtpd (the `test` extra) is not installed")
from aiosmtpd.controller import Controller  # noqa: E402
from aiosmtpd.smtp import AuthResult  # noqa: E402

from ftwatch.alerting.alerts import Notification, sample_alert  # noqa: E402
from ftwatch.alerting.notify import Sender  # noqa: E402
from ftwatch.alerting.notifiers import EmailNotifier, build_notifiers  # noqa: E402
from ftwatch.alerting.rendering import TemplateRenderer  # noqa: E402
from ftwatch.alerting.spool import Spool  # noqa: E402
from ftwatch.config.model import AlertingConfig  # noqa: E402
from ftwatch.errors import NotifyError  # noqa: E402

PASSWORD = "s3cret-Pa55"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Inbox:
    """An aiosmtpd handler: keeps what arrives, answers ``reply`` to DATA."""

    def __init__(self, reply: str = "250 OK"):
        self.reply = reply
        self.envelopes: list = []

    async def handle_DATA(self, server, session, envelope):
        if self.reply.startswith("250"):
            self.envelopes.append(envelope)
        return self.reply

    def messages(self) -> list[email.message.EmailMessage]:
        return [email.message_from_bytes(e.content, policy=email.policy.default)
                for e in self.envelopes]


@pytest.fixture
def smtp():
    started: list[Controller] = []

    def start(handler: Inbox, **kw) -> int:
        port = free_port()
        c = Controller(handler, hostname="127.0.0.1", port=port, **kw)
        c.start()
        started.append(c)
        return port

    yield start
    for c in started:
        c.stop()


def notification(language: str = "en", receiver: str = "mail") -> Notification:
    alert = sample_alert()
    text = TemplateRenderer(language).render("email", alert)
    return Notification(receiver, alert, text.splitlines()[0], text, f"{alert.decision_id}-{receiver}")


def notifier(port: int, **kw) -> EmailNotifier:
    return EmailNotifier("mail", "127.0.0.1", port, "ftwatch@example.com",
                         ["oncall@example.com", "ml-team@example.com"], timeout=5.0, **kw)


def test_the_message_arrives_with_headers_subject_text_and_html(smtp):
    inbox = Inbox()
    port = smtp(inbox)
    n = notification()
    notifier(port).send(n)
    [env] = inbox.envelopes
    assert env.mail_from == "ftwatch@example.com"
    assert env.rcpt_tos == ["oncall@example.com", "ml-team@example.com"]
    [msg] = inbox.messages()
    assert msg["Subject"] == n.title
    assert msg["Subject"].startswith("[ftwatch] warning: restart_job for job demo-job")
    assert msg["From"] == "ftwatch@example.com"
    assert msg["To"] == "oncall@example.com, ml-team@example.com"
    assert msg["Message-ID"] == f"<{n.id}@ftwatch>"
    assert msg["X-Ftwatch-Decision"] == n.alert.decision_id
    assert msg["X-Ftwatch-Status"] == "firing" and msg["Date"]
    assert msg.get_content_type() == "multipart/alternative"
    text = msg.get_body(("plain",)).get_content()
    html = msg.get_body(("html",)).get_content()
    for value in ("demo-job", "restart_job", "worker-1", "2026-11-21T08:36:03.735+00:00",
                  "torch.distributed.DistBackendError: NCCL error: unhandled system error",
                  "Restarts left:  2", f"ftwatch explain --state-dir .ftwatch-state {n.alert.decision_id}"):
        assert value in text, value
        assert value in html, value
    assert n.title not in text          # the subject line is not repeated in the body
    assert "<h3>[ftwatch] warning" in html


def test_chinese_subject_and_body_survive_the_trip(smtp):
    inbox = Inbox()
    port = smtp(inbox)
    notifier(port).send(notification("zh"))
    [msg] = inbox.messages()
    assert msg["Subject"].startswith("【ftwatch】任务 demo-job：重启整个任务")
    assert b"=?utf-8?" in inbox.envelopes[0].content.split(b"\r\n\r\n")[0].lower()  # RFC 2047
    assert "剩余重启次数：2（已使用 1 次）" in msg.get_body(("plain",)).get_content()


def test_554_is_a_failed_delivery_kept_as_a_dead_letter(smtp, tmp_path: Path):
    port = smtp(Inbox("554 5.7.1 Message rejected"))
    n = notifier(port)
    with pytest.raises(NotifyError) as info:
        n.send(notification())
    assert not info.value.retryable and "554" in str(info.value)
    spool = Spool(tmp_path / "spool")
    [result] = Sender([n], TemplateRenderer("en"), spool, sleep=lambda s: None).dispatch(sample_alert())
    assert (result.status, result.attempts) == ("failed", 1)
    assert len(list(spool.dead_dir.glob("*.json"))) == 1 and spool.pending() == []


def test_a_transient_4xx_is_retried_spooled_and_resent_when_the_server_takes_it(smtp, tmp_path: Path):
    inbox = Inbox("451 4.3.0 Try again later")
    port = smtp(inbox)
    sleeps: list[float] = []
    spool = Spool(tmp_path / "spool")
    d = Sender([notifier(port, max_retries=2)], TemplateRenderer("en"), spool, sleep=sleeps.append)
    [result] = d.dispatch(sample_alert())
    assert (result.status, result.attempts) == ("spooled", 3) and len(sleeps) == 2
    assert "451" in result.error and len(spool.pending()) == 1
    inbox.reply = "250 OK"
    assert d.resend_pending() == 1
    assert len(inbox.messages()) == 1 and spool.pending() == []


def test_connection_refused_is_retryable_and_spooled(tmp_path: Path):
    port = free_port()                       # nothing listens there
    spool = Spool(tmp_path / "spool")
    d = Sender([notifier(port, max_retries=1)], TemplateRenderer("en"), spool,
                   sleep=lambda s: None)
    [result] = d.dispatch(sample_alert())
    assert result.status == "spooled" and "unreachable" in result.error
    assert len(spool.pending()) == 1


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (needed to make a test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_auth_over_starttls(smtp, tls_files):
    cert, key = tls_files
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    logins: list[tuple[bytes, bytes]] = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        logins.append((auth_data.login, auth_data.password))
        ok = auth_data.password == PASSWORD.encode()
        return AuthResult(success=ok, handled=False)   # handled=False: the server answers 235/535

    inbox = Inbox()
    port = smtp(inbox, tls_context=server_tls, require_starttls=True, auth_required=True,
                auth_require_tls=True, authenticator=authenticator)
    good = notifier(port, starttls=True, ca_file=cert, username="ftwatch", password=PASSWORD)
    good.send(notification())
    assert logins[0] == (b"ftwatch", PASSWORD.encode())
    assert len(inbox.messages()) == 1

    wrong = notifier(port, starttls=True, ca_file=cert, username="ftwatch", password="wrong-password")
    with pytest.raises(NotifyError) as info:
        wrong.send(notification())
    assert "535" in str(info.value) and not info.value.retryable

    plain = notifier(port)                   # the server requires STARTTLS first
    with pytest.raises(NotifyError) as info:
        plain.send(notification())
    assert "530" in str(info.value)

    untrusted = notifier(port, starttls=True, username="ftwatch", password=PASSWORD)
    with pytest.raises(NotifyError) as info:   # self-signed, not in the system's CAs
        untrusted.send(notification())
    assert info.value.retryable and "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    assert PASSWORD not in repr(good) and len(inbox.messages()) == 1


def test_email_receiver_config_validates_and_builds():
    cfg = AlertingConfig.model_validate({"receivers": [
        {"type": "email", "name": "mail", "host": "smtp.example.com", "port": 587,
         "username": "u", "password": PASSWORD, "from_addr": "ftwatch@example.com",
         "to": ["a@example.com"], "starttls": True}]})
    [r] = cfg.receivers
    assert (r.port, r.timeout, r.max_retries, r.ssl) == (587, 10.0, 3, False)
    assert PASSWORD not in repr(r)
    [n] = build_notifiers(cfg.receivers)
    assert isinstance(n, EmailNotifier) and n.starttls and n.max_retries == 3
    for bad in ({"ssl": True, "starttls": True}, {"to": []}, {"username": "only-user"}):
        with pytest.raises(ValueError):
            AlertingConfig.model_validate({"receivers": [
                {"type": "email", "name": "m", "host": "h", "from_addr": "f@x", "to": ["t@x"], **bad}]})
