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
