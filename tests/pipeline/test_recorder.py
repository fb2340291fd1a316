"""The recorder retries spooled alerts during a run, not only at start (N4)."""

import io

from ftwatch.pipeline.recorder import RESEND_SECONDS, Recorder


class CountingDispatcher:
    """A stand-in dispatcher that counts resend passes (the recorder's timing is under test)."""

    def __init__(self):
        self.passes = 0

    def resend_pending(self) -> int:
        self.passes += 1
        return 0


def test_resend_runs_every_interval_and_not_more_often():
    """No pass at the first call (start already resent), then one per RESEND_SECONDS."""
    dispatcher = CountingDispatcher()
    rec = Recorder(dispatcher=dispatcher, out=io.StringIO())
    t = 1000.0
    rec.resend_due(t)
    assert dispatcher.passes == 0
    rec.resend_due(t + RESEND_SECONDS - 0.1)
    assert dispatcher.passes == 0
    rec.resend_due(t + RESEND_SECONDS)
    assert dispatcher.passes == 1
    rec.resend_due(t + RESEND_SECONDS + 1)
    assert dispatcher.passes == 1
    rec.resend_due(t + 2 * RESEND_SECONDS)
    assert dispatcher.passes == 2


def test_no_dispatcher_is_fine():
    """Without alerting configured nothing happens."""
    assert Recorder(out=io.StringIO()).resend_due(5.0) == 0
