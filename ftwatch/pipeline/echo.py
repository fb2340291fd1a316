"""What ``ftwatch run`` shows of its workers' output on its own terminal: each line prefixed with
``[rankN]`` (``!`` for stderr), and a progress bar's ``\r``-separated updates folded into their
last state, as a terminal would show them."""

from __future__ import annotations

from ftwatch.events import Origin


def echo_text(origin: Origin, data: bytes) -> str:
    """The terminal text for one chunk of a worker's complete lines.

    Args:
        origin: the worker (its rank or instance names the prefix; stream ``stderr`` adds ``!``).
        data: complete lines as read (ending in ``\n`` or a bare ``\r``); invalid UTF-8 replaced.

    Returns:
        One ``"<prefix> <line>\n"`` per line that shows something.
    """
    prefix = f"[rank{origin.rank}]" if origin.rank is not None else f"[{origin.instance}]"
    if origin.stream == "stderr":
        prefix += "!"
    if b"\r" not in data and prefix.isascii():
        # no progress bar: the prefixes put in as bytes, one decode after (the same text: an
        # invalid byte sequence ends at a newline either way). Replacing in the decoded text cost
        # ~6x as much: ~240 us against ~40 us, the write included, for 66 KiB of step lines; ~10 %
        # of ``run``'s loop at 10,000 lines/s (issue 16)
        head = prefix.encode() + b" "
        body = data[:-1] if data.endswith(b"\n") else data
        return (head + body.replace(b"\n", b"\n" + head) + b"\n").decode("utf-8", "replace")
    text = data.decode("utf-8", "replace")
    if "\r" not in text:          # a prefix of other characters: one replace, no per-line Python work
        body = text[:-1] if text.endswith("\n") else text
        return f"{prefix} " + body.replace("\n", f"\n{prefix} ") + "\n"
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return "".join(f"{prefix} {line}\n" for line in map(last_update, lines) if line is not None)


def last_update(line: str) -> str | None:
    """What a terminal shows of a line: a progress bar's ``\\r``-separated updates give their last
    non-blank one (None when all are blank); a line without ``\\r`` is itself."""
    if "\r" not in line:
        return line
    return next((u for u in reversed(line.split("\r")) if u.strip()), None)
