"""The terminal echo of ``ftwatch run``: prefixes per rank and stream, progress bars folded."""

from ftwatch.events import Origin
from ftwatch.pipeline.echo import echo_text, last_update


def test_prefix_names_the_rank_or_instance_and_marks_stderr():
    assert echo_text(Origin("worker-1", 1, "j", stream="stdout"), b"a\nb\n") == "[rank1] a\n[rank1] b\n"
    assert echo_text(Origin("worker-1", None, "j", stream="stderr"), b"oops\n") == "[worker-1]! oops\n"


def test_a_progress_bar_shows_its_last_update_only():
    bar = b"  0%|          | 0/10\r 50%|#####     | 5/10\r100%|##########| 10/10\n"
    assert echo_text(Origin("w", 0, "j"), bar) == "[rank0] 100%|##########| 10/10\n"
    assert last_update("\r  \r") is None and last_update("plain") == "plain"
    assert echo_text(Origin("w", 0, "j"), b"x\xff\n") == "[rank0] x\ufffd\n"


def _decoded_then_prefixed(prefix: str, data: bytes) -> str:
    """The echo of lines without ``\\r`` as the text path makes it: decoded first, prefixed after."""
    text = data.decode("utf-8", "replace")
    body = text[:-1] if text.endswith("\n") else text
    return f"{prefix} " + body.replace("\n", f"\n{prefix} ") + "\n"


def test_lines_prefixed_as_bytes_read_as_the_text_path_reads_them():
    chunks = [b"a\nb\n", b"no newline at the end", b"\n", b"\n\n", b"x\xe2\x82\ny\n", b"\xf0\x9f\x98\x80 ok\n",
              b"cut \xf0\x9f\n\x98\x80 rest\n", b"\xff\xfe\n\x80\n", "caf\u00e9 \u4e2d\n".encode()]
    for origin, prefix in ((Origin("w", 3, "j", stream="stdout"), "[rank3]"),
                           (Origin("w", 3, "j", stream="stderr"), "[rank3]!"),
                           (Origin("w-\u00e9", None, "j", stream="stdout"), "[w-\u00e9]")):   # not ASCII: the text path
        for data in chunks:
            assert echo_text(origin, data) == _decoded_then_prefixed(prefix, data), (origin, data)
