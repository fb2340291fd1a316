"""Horovod's coordinator in a traceback (rules/packs/gloo.yaml, issue 12 item 3): ranks that
submitted different collectives are the program's error, whatever the exception class; the
shutdown every other rank then raises is fallout of it (SPEC R7)."""

from __future__ import annotations

from ftwatch.events import FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
             "allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown "
             "was caused by an exception, you should see the exception in the log before the first shutdown message.")


def traceback(rank: int, t: float, final: str) -> list[Finding]:
    lines = ["Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
             "    hvd.allreduce(t, name='loss')",
             '  File "/opt/conda/lib/python3.10/site-packages/horovod/torch/mpi_ops.py", line 307, in synchronize',
             "    raise HorovodInternalError(e)", final]
    o = Origin(f"rank{rank}", rank, "hvd", "node-0", "stderr", "process")     # one rank's own log
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), 1_795_000_000.0 + t, final=True)


def test_mismatched_requests_are_the_program_error_and_the_shutdown_its_fallout():
    found = [*traceback(0, 1.0, "horovod.common.exceptions.HorovodInternalError: Mismatched MPI operations: One "
                                "rank did an ALLREDUCE, but another rank did an ALLGATHER."),
             *traceback(1, 2.0, f"horovod.common.exceptions.HorovodInternalError: {SHUT_DOWN}")]
    assert [f.rule_id for f in found] == ["horovod.request_mismatch", "horovod.shut_down"]
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "horovod.request_mismatch" and rc.rank == 0
    assert rc.failure_class is FailureClass.USER_CODE


def test_a_shutdown_with_no_exception_before_it_stays_fallout():
    an = analyse(traceback(1, 2.0, f"horovod.common.exceptions.HorovodInternalError: {SHUT_DOWN}"), world=2)
    assert an.fallout_only and an.root_cause.rule_id == "horovod.shut_down"
