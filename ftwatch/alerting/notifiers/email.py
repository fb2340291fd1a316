"""The email receiver: one message per notification over SMTP (SPEC N2).

The ``email`` template's first line is the Subject; the rest is the ``text/plain`` body, and an
HTML alternative (``multipart/alternative``, RFC 2046 §5.1.4) shows the same text escaped in a
``<pre>`` block. Headers: ``From``, ``To``, ``Subject`` (RFC 2047-encoded when not ASCII, by the
``email`` package), ``Date``, ``Message-ID: <notification id@ftwatch>`` (stable, so a resend
after a lost reply can be recognised), ``X-Ftwatch-Decision``, ``X-Ftwatch-Status``.

Transport (stdlib ``smtplib``): plain SMTP (RFC 5321), optionally upgraded with STARTTLS
(RFC 3207), or SMTPS (implicit TLS, RFC 8314 §3.3); AUTH (RFC 4954) when a username is set.
TLS verifies the server's certificate and host name (``ca_file`` or the system's CAs).

What a failure means (RFC 5321 §4.2.1 reply classes):

* cannot connect, timeout, connection lost, TLS handshake failure, a ``4yz`` reply
  (transient) -> retryable: retried with backoff, then spooled;
* a ``5yz`` reply (permanent: ``554`` transaction failed, ``550`` mailbox unavailable,
  ``535`` authentication failed, ...) -> not retryable: kept as a dead letter in the spool
  (nothing is lost; fix the config and resend by hand);
* some recipients refused, others accepted -> delivered (logged): resending would duplicate
  the message for the accepted ones.

The password never appears in an error message or a repr.
"""

from __future__ import annotations

import html
import logging
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate
from pathlib import Path
from typing import Any, Mapping, Sequence

from ftwatch.alerting.alerts import Notification
from ftwatch.errors import NotifyError

log = logging.getLogger(__name__)


def build_message(notification: Notification, from_addr: str, to: Sequence[str]) -> EmailMessage:
    """The email for one notification (see the module docstring for its shape)."""
    lines = notification.body.splitlines()
    subject = " ".join((notification.title or (lines[0] if lines else "ftwatch alert")).split())
    text = "\n".join(lines[1:]).strip("\n") if lines else ""
    msg = EmailMessage()
    msg["Subject"] = subject[:200]
    msg["From"] = from_addr
    msg["To"] = ", ".join(to)
    msg["Date"] = formatdate(notification.alert.starts_at if notification.alert.ends_at is None
                             else notification.alert.ends_at, localtime=False, usegmt=True)
    msg["Message-ID"] = f"<{notification.id}@ftwatch>"
    msg["X-Ftwatch-Decision"] = notification.alert.decision_id
    msg["X-Ftwatch-Status"] = notification.alert.status
    msg.set_content(text + "\n", charset="utf-8")
    msg.add_alternative(
        "<!DOCTYPE html>\n<html><body>\n"
        f"<h3>{html.escape(subject)}</h3>\n"
        '<pre style="font-family: monospace; white-space: pre-wrap">'
        f"{html.escape(text)}</pre>\n</body></html>\n", subtype="html", charset="utf-8")
    return msg


class EmailNotifier:
    """Sends each notification as an email.

    Args:
        name: the receiver's name.
        host, port: the SMTP server.
        from_addr: the envelope sender and ``From``.
        to: the recipients (at least one).
        username, password: SMTP AUTH credentials (both or neither).
        starttls: upgrade with STARTTLS before AUTH (the server must offer it).
        use_ssl: implicit TLS (SMTPS); not together with ``starttls``.
        ca_file: PEM CA bundle to verify the server with (None: the system's CAs).
        timeout: seconds per connection attempt and per SMTP command.
        max_retries: retries within one dispatch (None: the sender's).

    Raises:
        ValueError: no recipient, or both ``starttls`` and ``use_ssl``.
    """

    kind = "email"

    def __init__(self, name: str, host: str, port: int, from_addr: str, to: Sequence[str], *,
                 username: str | None = None, password: str | None = None,
                 starttls: bool = False, use_ssl: bool = False, ca_file: str | Path | None = None,
                 timeout: float = 10.0, max_retries: int | None = None):
        if not to:
            raise ValueError(f"email receiver {name!r}: no recipient")
        if starttls and use_ssl:
            raise ValueError(f"email receiver {name!r}: starttls and ssl exclude each other")
        self.name = name
        self.host, self.port = host, int(port)
        self.from_addr, self.to = from_addr, list(to)
        self.username, self._password = username, password
        self.starttls, self.use_ssl = starttls, use_ssl
        self.ca_file = None if ca_file is None else str(ca_file)
        self.timeout = timeout
        self.max_retries = max_retries

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> "EmailNotifier":
        """One notifier from a config entry (``ftwatch.config.receivers.EmailReceiver`` fields).

        Raises:
            KeyError: ``name``, ``host``, ``from_addr`` or ``to`` is missing.
        """
        return cls(str(data["name"]), str(data["host"]), int(data.get("port", 25)),
                   str(data["from_addr"]), list(data["to"]), username=data.get("username"),
                   password=data.get("password"), starttls=bool(data.get("starttls", False)),
                   use_ssl=bool(data.get("ssl", False)), ca_file=data.get("ca_file"),
                   timeout=float(data.get("timeout", 10.0)), max_retries=data.get("max_retries"))

    def tls_context(self) -> ssl.SSLContext:
        """A client context that verifies the server (certificate and host name)."""
        return ssl.create_default_context(cafile=self.ca_file)

    def send(self, notification: Notification) -> None:
        """Send one notification as an email.

        Raises:
            NotifyError: retryable for connection problems, timeouts, TLS failures and 4yz
                replies; not retryable for 5yz replies (see the module docstring).
        """
        msg = build_message(notification, self.from_addr, self.to)
        try:
            with self._connect() as smtp:
                if self.starttls:
                    smtp.starttls(context=self.tls_context())
                    smtp.ehlo()
                if self.username is not None:
                    smtp.login(self.username, self._password or "")
                refused = smtp.send_message(msg, from_addr=self.from_addr, to_addrs=self.to)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            raise self._failure(f"refused every recipient ({', '.join(map(str, codes))})",
                                all(400 <= c < 500 for c in codes)) from None
        except smtplib.SMTPResponseException as exc:
            detail = exc.smtp_error.decode("utf-8", "replace") if isinstance(
                exc.smtp_error, bytes) else str(exc.smtp_error)
            raise self._failure(f"answered {exc.smtp_code} {' '.join(detail.split())[:200]}",
                                400 <= exc.smtp_code < 500) from None
        except smtplib.SMTPNotSupportedError as exc:
            raise self._failure(f"does not support what the config asks: {exc}", False) from None
        except (smtplib.SMTPException, ssl.SSLError, OSError) as exc:
            # connect refused, timeout, server disconnected, certificate not trusted ...
            raise self._failure(f"unreachable: {type(exc).__name__}: {exc}", True) from None
        if refused:
            log.warning("email receiver %r: recipients refused: %s", self.name,
                        ", ".join(f"{r} ({c})" for r, (c, _) in refused.items()))

    def _connect(self) -> smtplib.SMTP:
        if self.use_ssl:
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout,
                                                  context=self.tls_context())
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        try:
            smtp.ehlo()
        except BaseException:
            smtp.close()
            raise
        return smtp

    def _failure(self, detail: str, retryable: bool) -> NotifyError:
        text = f"email {self.name!r}: smtp://{self.host}:{self.port} {detail}"
        if self._password and len(self._password) >= 3:
            text = text.replace(self._password, "***")
        return NotifyError(text, retryable=retryable)

    def __repr__(self) -> str:
        return f"EmailNotifier(name={self.name!r}, host={self.host!r}, port={self.port})"

