"""Config models of the chat-bot receivers (SPEC N2): DingTalk, Feishu/Lark, WeCom, Slack; and of
the email (SMTP) and Prometheus Alertmanager receivers.

Each is one kind of ``alerting.receivers[]`` entry, told apart by ``type:``; ``ftwatch.config.model``
puts them in its ``Receiver`` union. URLs and secrets are never printed (``repr=False``; the
notifiers redact them from every message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ftwatch.config.routes import Duration

_STRICT = ConfigDict(extra="forbid")
_URL = r"^https?://"


class _ChatBotReceiver(BaseModel):
    """What every chat-bot receiver has besides its ``type`` and ``url``."""

    model_config = _STRICT
    name: str = Field(description="Unique receiver name.")
    timeout: float = Field(5.0, gt=0, description="Seconds per request.")
    max_retries: int = Field(3, ge=0, description="Retries before the alert is spooled.")


class DingTalkReceiver(_ChatBotReceiver):
    """A DingTalk custom robot: markdown messages, signed when `secret` is set."""

    type: Literal["dingtalk"] = Field(description="Receiver kind.")
    url: str = Field(repr=False, pattern=_URL,
                     description="The robot's webhook URL (https://oapi.dingtalk.com/robot/send?access_token=...).")
    secret: str | None = Field(None, repr=False,
                               description="The robot's signing secret (SEC...); null: unsigned.")


class FeishuReceiver(_ChatBotReceiver):
    """A Feishu/Lark custom bot: card messages, signed when `secret` is set."""

    type: Literal["feishu"] = Field(description="Receiver kind.")
    url: str = Field(repr=False, pattern=_URL,
                     description="The bot's webhook URL (https://open.feishu.cn/open-apis/bot/v2/hook/...).")
    secret: str | None = Field(None, repr=False, description="The bot's signing secret; null: unsigned.")


class WeComReceiver(_ChatBotReceiver):
    """A WeCom group robot: markdown messages (the URL's key is the secret)."""

    type: Literal["wecom"] = Field(description="Receiver kind.")
    url: str = Field(repr=False, pattern=_URL,
                     description="The robot's webhook URL (https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=...).")


class SlackReceiver(_ChatBotReceiver):
    """A Slack incoming webhook (the URL's path is the secret)."""

    type: Literal["slack"] = Field(description="Receiver kind.")
    url: str = Field(repr=False, pattern=_URL,
                     description="The incoming webhook URL (https://hooks.slack.com/services/...).")


class EmailReceiver(BaseModel):
    """Email over SMTP (RFC 5321), a text body with an HTML alternative (RFC 2046)."""

    model_config = _STRICT
    type: Literal["email"] = Field(description="Receiver kind.")
    name: str = Field(description="Unique receiver name.")
    host: str = Field(description="SMTP server host name or address.")
    port: int = Field(25, ge=1, le=65535, description="SMTP port (25; 587 submission with starttls; 465 with ssl).")
    username: str | None = Field(None, description="SMTP AUTH user (RFC 4954); null: no AUTH.")
    password: str | None = Field(None, repr=False, description="SMTP AUTH password (never printed).")
    from_addr: str = Field(description="The From address (ftwatch@example.com).")
    to: list[str] = Field(min_length=1, description="Recipient addresses.")
    starttls: bool = Field(False, description="Upgrade the connection with STARTTLS (RFC 3207) before AUTH.")
    ssl: bool = Field(False, description="Connect over TLS from the start (SMTPS, port 465).")
    ca_file: Path | None = Field(None, description="PEM CA bundle to verify the server with; null: the system's.")
    timeout: float = Field(10.0, gt=0, description="Seconds per SMTP connection and command.")
    max_retries: int = Field(3, ge=0, description="Retries before the alert is spooled.")

    @model_validator(mode="after")
    def _tls_once(self) -> "EmailReceiver":
        if self.ssl and self.starttls:
            raise ValueError("email: set either ssl (SMTPS) or starttls, not both")
        if (self.username is None) != (self.password is None):
            raise ValueError("email: username and password go together")
        return self


class AlertmanagerReceiver(BaseModel):
    """A Prometheus Alertmanager: alerts POSTed to ``<url>/api/v2/alerts``, resolved ones too."""

    model_config = _STRICT
    type: Literal["alertmanager"] = Field(description="Receiver kind.")
    name: str = Field(description="Unique receiver name.")
    url: str = Field(pattern=_URL, description="Alertmanager base URL (http://alertmanager:9093).")
    resolve_after: Duration = Field(
        300.0, gt=0, description="Seconds (or a duration: 30s, 5m, 1h) after a restart/hang/isolate "
        "incident of a job with no new one that its alert resolves (also sent as the firing alert's endsAt).")
    timeout: float = Field(5.0, gt=0, description="Seconds per request.")
    max_retries: int = Field(3, ge=0, description="Retries before the alert is spooled.")
    labels: dict[str, str] = Field(default_factory=dict, description="Static labels added to every alert.")


CHATBOT_RECEIVERS: dict[str, type[BaseModel]] = {
    "dingtalk": DingTalkReceiver, "feishu": FeishuReceiver, "wecom": WeComReceiver,
    "slack": SlackReceiver}
"""``type:`` -> the chat-bot receiver model."""

OTHER_RECEIVERS: dict[str, type[BaseModel]] = {
    "email": EmailReceiver, "alertmanager": AlertmanagerReceiver}
"""``type:`` -> the email and Alertmanager receiver models."""
