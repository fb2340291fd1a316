"""The console receiver: prints each alert as a framed block of text (SPEC N2)."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from ftwatch.alerting.alerts import Notification
from ftwatch.errors import NotifyError

_COLORS = {"critical": "\033[1;31m", "warning": "\033[1;33m", "info": "\033[1;36m"}
_GREEN = "\033[1;32m"
_RESET = "\033[0m"
_WIDTH = 72


class ConsoleNotifier:
    """Writes notifications to a text stream.

    Args:
        stream: where to write; None means ``sys.stdout`` as it is at send time (so that
            redirections made after construction are honoured).
        color: colour the frame's title by severity with ANSI escapes.
        name: the receiver's name.
    """

    kind = "console"
    inline = True   # send never blocks: delivered in the caller's thread (the terminal stays in order)

    def __init__(self, stream: TextIO | None = None, color: bool = False, name: str = "console"):
        self.name = name
        self.stream = stream
        self.color = color
        self._lock = threading.Lock()

    def format(self, notification: Notification) -> str:
        """The framed block for one notification (ends with a newline); a resolved alert is
        one line, its title."""
        lines = notification.body.splitlines() or [notification.title]
        title = lines[0]
        head = f"==== {title} "
        head += "=" * max(4, _WIDTH - len(head))
        if self.color:
            sev = notification.alert.labels.get("severity", "info")
            color = _GREEN if notification.alert.status == "resolved" else _COLORS.get(sev, "")
            head = f"{color}{head}{_RESET}"
        if notification.alert.status == "resolved":
            return f"{head}\n"
        body = "".join(f"| {line}\n" for line in lines[1:])
        return f"{head}\n{body}{'=' * _WIDTH}\n"

    def send(self, notification: Notification) -> None:
        """Print the block.

        Raises:
            NotifyError: (not retryable) when the stream cannot be written.
        """
        stream = self.stream if self.stream is not None else sys.stdout
        try:
            with self._lock:
                stream.write(self.format(notification))
                stream.flush()
        except (OSError, ValueError) as exc:
            raise NotifyError(f"console {self.name!r}: cannot write: {exc}", retryable=False) from exc

    def __repr__(self) -> str:
        return f"ConsoleNotifier(name={self.name!r}, color={self.color})"
