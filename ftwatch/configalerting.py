"""Config models of the chat-bot receivers (SPEC N2): DingTalk, Feishu/Lark, WeCom, Slack.

Each is one kind of ``alerting.receivers[]`` entry, told apart by ``type:``; ``ftwatch.config``
puts them in its ``Receiver`` union. URLs and secrets are never printed (``repr=False``; the
notifiers redact them from every message).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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


CHATBOT_RECEIVERS: dict[str, type[BaseModel]] = {
    "dingtalk": DingTalkReceiver, "feishu": FeishuReceiver, "wecom": WeComReceiver,
    "slack": SlackReceiver}
"""``type:`` -> the chat-bot receiver model."""
