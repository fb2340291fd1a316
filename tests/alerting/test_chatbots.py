"""N2: the chat-bot receivers (DingTalk, Feishu/Lark, WeCom, Slack) against local HTTP servers
that answer like each service: signatures verified server-side, error codes in HTTP 200
bodies, rate-limit answers; driven through the real Sender with a no-op sleep."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs, urlsplit

import pytest

from ftwatch.alerting.alerts import Alert, alert_from_decision
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.notify import Sender
from ftwatch.alerting.notifiers import (REGISTRY, ConsoleNotifier, DingTalkNotifier, FeishuNotifier,
                                        SlackNotifier, WebhookNotifier, WeComNotifier,
                                        build_notifiers)
from ftwatch.alerting.spool import Spool
from ftwatch.config.model import load_config
from ftwatch.config.receivers import DingTalkReceiver, FeishuReceiver, SlackReceiver, WeComReceiver
from ftwatch.errors import ConfigError
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target

SECRET = "SEC0123456789abcdef-shared-secret"
TOKEN = "tok-9f8e7d6c5b4a"
SLACK_PATH = "/services/T0ABCDEFG/B0HIJKLMN/xXyYzZ0123456789abcd"

Answer = tuple[int, dict, bytes]


class Bot:
    """A real HTTP server on 127.0.0.1 answering like one chat service.

    ``answer(path, query, body) -> (status, headers, body bytes)`` is the service's logic;
    ``script`` holds modes ("ok", "limit", "error") for the next requests, then ``default``.
    """

    def __init__(self, answer: Callable[["Bot", str, dict, dict], Answer]):
        self.script: list[str] = []
        self.default = "ok"
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                split = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(split.query).items()}
                body = json.loads(raw)
                with owner.lock:
                    owner.requests.append({"path": split.path, "query": query, "json": body})
                    status, headers, payload = answer(owner, split.path, query, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def mode(self) -> str:
        return self.script.pop(0) if self.script else self.default

    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _json(status: int, obj: dict) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps(obj).encode()


# --------------------------------------------------------------------------- the services


def dingtalk(bot: Bot, path: str, query: dict, body: dict) -> Answer:
    """DingTalk custom robot: token, then signature (timestamp ms within an hour), then body."""
    if path != "/robot/send" or query.get("access_token") != TOKEN:
        return _json(200, {"errcode": 300001, "errmsg": "token is not exist"})
    ts, sign = query.get("timestamp", ""), query.get("sign", "")
    digest = hmac.new(SECRET.encode(), f"{ts}\n{SECRET}".encode(), hashlib.sha256).digest()
    if not ts.isdigit() or abs(int(ts) - time.time() * 1000) > 3_600_000:
        return _json(200, {"errcode": 310000, "errmsg": "invalid timestamp"})
    if not hmac.compare_digest(sign, base64.b64encode(digest).decode()):
        return _json(200, {"errcode": 310000, "errmsg": "sign not match"})
    if body.get("msgtype") != "markdown" or not body.get("markdown", {}).get("text"):
        return _json(200, {"errcode": 40035, "errmsg": "缺少参数 json"})
    mode = bot.mode()
    if mode == "limit":
        return _json(200, {"errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"})
    if mode == "error":
        return _json(200, {"errcode": 310000, "errmsg": "keywords not in content"})
    return _json(200, {"errcode": 0, "errmsg": "ok"})


def feishu(bot: Bot, path: str, query: dict, body: dict) -> Answer:
    """Feishu custom bot: signature in the body (timestamp s within an hour), then the card."""
    if path != f"/open-apis/bot/v2/hook/{TOKEN}":
        return _json(200, {"code": 19001, "msg": "param invalid: incoming webhook access token invalid"})
    ts, sign = str(body.get("timestamp", "")), body.get("sign", "")
    digest = hmac.new(f"{ts}\n{SECRET}".encode(), b"", hashlib.sha256).digest()
    if (not ts.isdigit() or abs(int(ts) - time.time()) > 3600
            or not hmac.compare_digest(sign, base64.b64encode(digest).decode())):
        return _json(200, {"code": 19021, "data": {},
                           "msg": "sign match fail or timestamp is not within one hour from current time"})
    if body.get("msg_type") != "interactive" or "card" not in body:
        return _json(200, {"code": 9499, "data": {}, "msg": "Bad Request"})
    mode = bot.mode()
    if mode == "limit":
        return _json(200, {"code": 11232, "data": {}, "msg": "frequency limited psm[lark.oapi.app_platform_runtime]"})
    if mode == "error":  # an older deployment's answer shape
        return _json(200, {"StatusCode": 19024, "StatusMessage": "Key Words Not Found"})
    return _json(200, {"StatusCode": 0, "StatusMessage": "success", "code": 0, "data": {}, "msg": "success"})


def wecom(bot: Bot, path: str, query: dict, body: dict) -> Answer:
    if path != "/cgi-bin/webhook/send" or query.get("key") != TOKEN:
        return _json(200, {"errcode": 93000, "errmsg": "invalid webhook url, hint: [1795250000_1_x]"})
    content = body.get("markdown", {}).get("content", "")
    if body.get("msgtype") != "markdown" or not content or len(content.encode()) > 4096:
        return _json(200, {"errcode": 40058, "errmsg": "markdown.content exceed max length 4096"})
    mode = bot.mode()
    if mode == "limit":
        return _json(200, {"errcode": 45009, "errmsg": "api freq out of limit"})
    return _json(200, {"errcode": 0, "errmsg": "ok"})


def slack(bot: Bot, path: str, query: dict, body: dict) -> Answer:
    plain = {"Content-Type": "text/html"}
    if path != SLACK_PATH:
        return 403, plain, b"invalid_token"
    if not isinstance(body.get("text"), str) or not body["text"]:
        return 400, plain, b"invalid_payload"
    mode = bot.mode()
    if mode == "limit":
        return 429, {**plain, "Retry-After": "7"}, b"rate_limited"
    if mode == "error":
        return 404, plain, b"channel_not_found"
    return 200, plain, b"ok"


SERVICES = {"dingtalk": dingtalk, "feishu": feishu, "wecom": wecom, "slack": slack}


def url_of(kind: str, bot: Bot) -> str:
    return {"dingtalk": f"{bot.base()}/robot/send?access_token={TOKEN}",
            "feishu": f"{bot.base()}/open-apis/bot/v2/hook/{TOKEN}",
            "wecom": f"{bot.base()}/cgi-bin/webhook/send?key={TOKEN}",
            "slack": f"{bot.base()}{SLACK_PATH}"}[kind]


def make_notifier(kind: str, bot: Bot, secret: str | None = SECRET):
    cls = REGISTRY[kind]
    return cls(f"{kind}-bot", url_of(kind, bot), secret=secret if kind in ("dingtalk", "feishu") else None)


@pytest.fixture(params=sorted(SERVICES))
def service(request):
    bot = Bot(SERVICES[request.param])
    yield request.param, bot
    bot.close()


def bot_for(kind: str):
    return Bot(SERVICES[kind])


def make_alert(t: float = 1_795_250_000.5) -> Alert:
    rc = Finding("nccl.unhandled_system_error", "keyword", FailureClass.RETRYABLE_INFRA,
                 Action.RESTART_JOB, Severity.ERROR, Origin("worker-1", 1, "job-7", "node-b"),
                 "NCCL error: unhandled system error", t - 3, 4, ("Traceback:", "NCCL error"))
    d = Decision(t, Action.RESTART_JOB, Target("job-7"), rc, "Sync: restart the whole job", 1, 2, (),
                 attempt=1)
    alert = alert_from_decision(d, f"ftwatch explain --state-dir /s {d.decision_id}")
    assert alert is not None
    return alert


def dispatcher(notifiers, spool_dir: Path, sleeps: list[float], **kw) -> Sender:
    return Sender(notifiers, TemplateRenderer("en"), Spool(spool_dir), sleep=sleeps.append, **kw)


def assert_no_secret(text: str) -> None:
    for secret in (SECRET, TOKEN, "xXyYzZ0123456789abcd"):
        assert secret not in text


# --------------------------------------------------------------------------- delivery


def test_each_bot_delivers_its_own_message_shape(service, tmp_path: Path):
    kind, bot = service
    sleeps: list[float] = []
    alert = make_alert()
    [result] = dispatcher([make_notifier(kind, bot)], tmp_path / "spool", sleeps).dispatch(alert)
    assert (result.status, result.attempts, result.error) == ("delivered", 1, "")
    assert sleeps == [] and len(bot.requests) == 1
    text = TemplateRenderer("en").render(kind, alert)
    assert text != TemplateRenderer("en").render("webhook", alert)  # a template of its own (N1)
    body = bot.requests[0]["json"]
    if kind == "dingtalk":
        assert text.startswith("#### ftwatch warning: restart_job for job job-7")
        assert body == {"msgtype": "markdown", "markdown": {
            "title": "ftwatch warning: restart_job for job job-7", "text": text}}
        assert set(bot.requests[0]["query"]) == {"access_token", "timestamp", "sign"}
    elif kind == "feishu":
        assert body["msg_type"] == "interactive" and set(body) == {"timestamp", "sign", "msg_type", "card"}
        card = body["card"]
        assert card["header"]["title"] == {"tag": "plain_text", "content": text.splitlines()[0]}
        assert card["header"]["template"] == "red"
        assert card["elements"] == [{"tag": "markdown", "content": text.split("\n", 1)[1]}]
    elif kind == "wecom":
        assert body == {"msgtype": "markdown", "markdown": {"content": text}}
    else:
        assert body == {"text": text}
    assert "NCCL error: unhandled system error" in text
    assert Spool(tmp_path / "spool").pending() == []


@pytest.mark.parametrize("kind", ["dingtalk", "feishu"])
def test_a_wrong_secret_is_refused_by_the_service_and_is_a_dead_letter(kind: str, tmp_path: Path):
    bot = bot_for(kind)
    try:
        notifier = REGISTRY[kind](f"{kind}-bot", url_of(kind, bot), secret="SECwrong-secret-value")
        sleeps: list[float] = []
        [result] = dispatcher([notifier], tmp_path / "spool", sleeps).dispatch(make_alert())
        assert (result.status, result.attempts) == ("failed", 1)
        assert "19021" in result.error if kind == "feishu" else "310000" in result.error
        assert "sign" in result.error and sleeps == []
        assert "SECwrong-secret-value" not in result.error
        assert_no_secret(result.error)
        [dead] = Spool(tmp_path / "spool").dead_letters()
        assert dead.id == result.notification_id
        # unsigned also fails: the service demands a signature
        [unsigned] = dispatcher([REGISTRY[kind]("u", url_of(kind, bot))], tmp_path / "s2",
                                []).dispatch(make_alert())
        assert unsigned.status == "failed"
    finally:
        bot.close()


def test_an_error_code_in_a_200_answer_is_a_failed_delivery(tmp_path: Path):
    for kind in ("dingtalk", "feishu"):
        bot = bot_for(kind)
        try:
            bot.script = ["error"]
            sleeps: list[float] = []
            [result] = dispatcher([make_notifier(kind, bot)], tmp_path / kind, sleeps).dispatch(make_alert())
            assert (result.status, result.attempts) == ("failed", 1), kind
            assert ("19024" if kind == "feishu" else "310000") in result.error
            assert sleeps == [] and len(bot.requests) == 1
            assert_no_secret(result.error)
        finally:
            bot.close()


@pytest.mark.parametrize("kind", ["dingtalk", "feishu", "wecom"])
def test_a_2xx_without_the_services_json_answer_is_a_retryable_failure(kind: str):
    """DingTalk, Feishu and WeCom always answer a JSON object; a 200 with an HTML page (a proxy,
    a captive portal) is not their answer: not delivered, worth retrying."""
    from ftwatch.alerting.alerts import Notification
    from ftwatch.errors import NotifyError
    bot = Bot(lambda bot, path, query, body: (200, {"Content-Type": "text/html"}, b"<html>proxy login</html>"))
    try:
        alert = make_alert()
        n = Notification(f"{kind}-bot", alert, "title", "body", f"{alert.decision_id}-{kind}-bot")
        with pytest.raises(NotifyError) as info:
            make_notifier(kind, bot).send(n)
        assert info.value.retryable and "without the service's JSON answer" in str(info.value)
        assert_no_secret(str(info.value))
    finally:
        bot.close()


def test_wecom_bad_key_is_not_retried_and_the_key_is_redacted(tmp_path: Path):
    bot = bot_for("wecom")
    try:
        hook = WeComNotifier("wc", f"{bot.base()}/cgi-bin/webhook/send?key=wrong-key-123")
        [result] = dispatcher([hook], tmp_path / "spool", []).dispatch(make_alert())
        assert (result.status, result.attempts) == ("failed", 1) and "93000" in result.error
        assert "wrong-key-123" not in result.error and "key=***" in result.error
    finally:
        bot.close()


def test_wecom_long_text_is_cut_to_4096_bytes(tmp_path: Path):
    bot = bot_for("wecom")
    try:
        long = tmp_path / "long.j2"
        long.write_text("{{ job }}\n" + "告警" * 3000 + "\n")
        d = Sender([make_notifier("wecom", bot)], TemplateRenderer("en", {"wecom": long}),
                       Spool(tmp_path / "spool"), sleep=lambda s: None)
        [result] = d.dispatch(make_alert())
        assert result.status == "delivered"
        content = bot.requests[0]["json"]["markdown"]["content"]
        assert len(content.encode()) <= 4096 and content.endswith("...")
    finally:
        bot.close()


def test_slack_invalid_payload_and_4xx_bodies_are_not_retried(tmp_path: Path):
    bot = bot_for("slack")
    try:
        bot.script = ["error"]
        sleeps: list[float] = []
        [result] = dispatcher([make_notifier("slack", bot)], tmp_path / "a", sleeps).dispatch(make_alert())
        assert (result.status, result.attempts) == ("failed", 1)
        assert "HTTP 404" in result.error and "channel_not_found" in result.error
        assert_no_secret(result.error)
        wrong = SlackNotifier("s", f"{bot.base()}/services/T0ABCDEFG/B0HIJKLMN/wrongwrongwrong")
        [result] = dispatcher([wrong], tmp_path / "b", sleeps).dispatch(make_alert())
        assert result.status == "failed" and "invalid_token" in result.error
        assert "wrongwrongwrong" not in result.error and "wrongwrongwrong" not in repr(wrong)
        assert sleeps == []
    finally:
        bot.close()


# --------------------------------------------------------------------------- rate limits


@pytest.mark.parametrize("kind", sorted(SERVICES))
def test_rate_limited_answers_are_retried_then_delivered(kind: str, tmp_path: Path):
    bot = bot_for(kind)
    try:
        bot.script = ["limit", "limit"]
        sleeps: list[float] = []
        [result] = dispatcher([make_notifier(kind, bot)], tmp_path / "spool", sleeps).dispatch(make_alert())
        assert (result.status, result.attempts, result.error) == ("delivered", 3, "")
        assert len(sleeps) == 2 and len(bot.requests) == 3
        if kind == "slack":  # Retry-After: 7 is honoured
            assert sleeps == [pytest.approx(7.0), pytest.approx(7.0)]
    finally:
        bot.close()


@pytest.mark.parametrize("kind", sorted(SERVICES))
def test_a_bot_that_keeps_rate_limiting_is_spooled_then_resent_once(kind: str, tmp_path: Path):
    bot = bot_for(kind)
    try:
        bot.default = "limit"
        spool_dir = tmp_path / "spool"
        [result] = dispatcher([make_notifier(kind, bot)], spool_dir, [], max_retries=1).dispatch(make_alert())
        assert (result.status, result.attempts) == ("spooled", 2)
        assert_no_secret(result.error)
        for path in spool_dir.rglob("*"):
            if path.is_file():
                assert SECRET not in path.read_text()
        bot.default = "ok"  # the service accepts again: a restarted ftwatch resends it once
        d = dispatcher([make_notifier(kind, bot)], spool_dir, [])
        assert d.resend_pending() == 1 and d.resend_pending() == 0
        assert len(bot.requests) == 3 and Spool(spool_dir).pending() == []
    finally:
        bot.close()


# --------------------------------------------------------------------------- signing, redaction


def test_signatures_match_the_documented_formulas():
    from ftwatch.alerting.notifiers.dingtalk import dingtalk_sign
    from ftwatch.alerting.notifiers.feishu import feishu_sign
    ts_ms = 1_795_250_000_123
    want = base64.b64encode(hmac.new(SECRET.encode(), f"{ts_ms}\n{SECRET}".encode(),
                                     hashlib.sha256).digest()).decode()
    assert dingtalk_sign(SECRET, ts_ms) == want
    want = base64.b64encode(hmac.new(f"1795250000\n{SECRET}".encode(), b"",
                                     hashlib.sha256).digest()).decode()
    assert feishu_sign(SECRET, 1_795_250_000) == want
    # the DingTalk sign is URL-encoded in the query (+, / and = escaped)
    d = DingTalkNotifier("d", f"https://oapi.dingtalk.com/robot/send?access_token={TOKEN}",
                         secret=SECRET, clock=lambda: ts_ms / 1000)
    url = d.request_url()
    assert f"timestamp={ts_ms}" in url
    sign = url.split("sign=")[1]
    assert "+" not in sign and "/" not in sign and "=" not in sign
    assert parse_qs(urlsplit(url).query)["sign"] == [dingtalk_sign(SECRET, ts_ms)]


def test_reprs_never_show_secrets():
    for notifier in (DingTalkNotifier("d", f"https://x.test/robot/send?access_token={TOKEN}", SECRET),
                     FeishuNotifier("f", f"https://x.test/open-apis/bot/v2/hook/{TOKEN}", SECRET),
                     WeComNotifier("w", f"https://x.test/cgi-bin/webhook/send?key={TOKEN}"),
                     SlackNotifier("s", f"https://hooks.slack.test{SLACK_PATH}")):
        assert SECRET not in repr(notifier) and "xXyYzZ0123456789abcd" not in repr(notifier)
        assert TOKEN not in repr(notifier)


# --------------------------------------------------------------------------- config


def test_a_config_with_every_receiver_type_validates_and_builds(tmp_path: Path):
    path = tmp_path / "ftwatch.yaml"
    tpl = tmp_path / "ding.j2"
    tpl.write_text("### {{ job }}\n")
    path.write_text(textwrap.dedent(f"""\
        alerting:
          receivers:
            - {{name: screen, type: console}}
            - {{name: hook, type: webhook, url: "https://example.test/hook"}}
            - name: ding
              type: dingtalk
              url: "https://oapi.dingtalk.com/robot/send?access_token={TOKEN}"
              secret: "{SECRET}"
            - {{name: lark, type: feishu, url: "https://open.feishu.cn/open-apis/bot/v2/hook/{TOKEN}",
                secret: "{SECRET}", timeout: 3, max_retries: 5}}
            - {{name: wx, type: wecom, url: "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={TOKEN}"}}
            - {{name: sl, type: slack, url: "https://hooks.slack.com{SLACK_PATH}"}}
          templates: {{dingtalk: ding.j2}}
        """))
    config = load_config(path)
    receivers = config.alerting.receivers
    assert [type(r) for r in receivers[2:]] == [DingTalkReceiver, FeishuReceiver, WeComReceiver, SlackReceiver]
    assert receivers[3].timeout == 3 and receivers[3].max_retries == 5 and receivers[5].max_retries == 3
    assert SECRET not in repr(config) and TOKEN not in repr(config)
    assert config.alerting.templates == {"dingtalk": tpl}
    built = build_notifiers(receivers)
    assert [type(n) for n in built] == [ConsoleNotifier, WebhookNotifier, DingTalkNotifier,
                                        FeishuNotifier, WeComNotifier, SlackNotifier]
    assert [n.kind for n in built] == ["console", "webhook", "dingtalk", "feishu", "wecom", "slack"]
    ding, lark = built[2], built[3]
    assert ding.secret == SECRET and (lark.timeout, lark.max_retries) == (3.0, 5)
    assert built[4].secret is None


def test_unknown_receiver_types_and_bad_fields_are_rejected_with_file_and_line(tmp_path: Path):
    path = tmp_path / "ftwatch.yaml"
    path.write_text(textwrap.dedent("""\
        alerting:
          receivers:
            - {name: ding, type: dingtalk, url: "https://oapi.dingtalk.com/robot/send"}
            - {name: tg, type: telegram, url: "https://api.telegram.org/x"}
            - {name: wx, type: wecom, url: "https://qyapi.weixin.qq.com/x", secret: nope}
            - {name: sl, type: slack, url: "ftp://hooks.slack.com/x"}
        """))
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    issues = [(i.file, i.line, i.message) for i in excinfo.value.issues]
    assert [line for _, line, _ in issues] == [4, 5, 6]
    assert all(file == str(path) for file, _, _ in issues)
    assert "telegram" in issues[0][2] and "dingtalk" in issues[0][2]
    assert issues[1][2].startswith("alerting.receivers[2].secret: unknown key")
    assert issues[2][2].startswith("alerting.receivers[3].url:")
    assert f"{path}:4:" in str(excinfo.value)
    with pytest.raises(ValueError, match="missing field 'url'"):
        build_notifiers([{"type": "dingtalk", "name": "d", "secret": SECRET}])
