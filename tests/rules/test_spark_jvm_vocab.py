"""Spark and JVM rows of ``stacks_vocab.tsv``: a cluster manager dropping a node (Spark's master
for missed heartbeats, an executor lost with its worker) is retryable, a memory kill or a JVM
``OutOfMemoryError`` is oom, and an uncaught exception out of a JVM's main thread ends the program
like a Python traceback (user_code catch-all); another thread's uncaught exception is no finding."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass
from tests.rules.test_stacks_vocab import findings      # the built-in rules over lines of one stream


@pytest.mark.parametrize("line, rule, failure_class, action", [
    ("17/03/17 14:36:25 WARN Master: Removing worker-20170311135327-10.20.4.12-45720 because we got no heartbeat "
     "in 60 seconds", "spark.worker_heartbeat_lost", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("ERROR TaskSchedulerImpl: Lost executor 1 on 172.16.0.5: Executor heartbeat timed out after 120009 ms",
     "spark.executor_lost_with_node", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("WARN TaskSetManager: Lost task 2.0 in stage 19.0 (TID 76981, 10.20.4.12, executor 2): ExecutorLostFailure "
     "(executor 2 exited caused by one of the running tasks) Reason: worker lost",
     "spark.executor_lost_with_node", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("ERROR YarnClusterScheduler: Lost executor 2 on node-7: Container killed by YARN for exceeding memory limits. "
     "9.1 GB of 9 GB physical memory used.", "spark.yarn_memory_limit", FailureClass.OOM, Action.FAIL_JOB),
    ('Exception in thread "main" java.lang.OutOfMemoryError: GC overhead limit exceeded', "jvm.out_of_memory",
     FailureClass.OOM, Action.FAIL_JOB),
    ('Exception in thread "main" java.util.NoSuchElementException: None.get', "jvm.uncaught_exception_main",
     FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_spark_and_jvm_lines_are_graded_by_what_their_source_says(line, rule, failure_class, action):
    (hit,) = findings(line)
    assert (hit.rule_id, hit.failure_class, hit.action) == (rule, failure_class, action)


@pytest.mark.parametrize("line", [
    'Exception in thread "Thread-7" java.lang.IllegalStateException: queue closed',
    "17/03/17 14:36:25 INFO Master: Registering worker 10.20.4.12:45720 with 8 cores, 60.0 GB RAM",
    "Container killed on request. Exit code is 143",
])
def test_lines_that_end_no_program_and_lose_no_node_are_no_spark_or_jvm_finding(line):
    assert not [f for f in findings(line) if f.rule_id.startswith(("spark.", "jvm."))]


def test_a_lost_executors_memory_kill_outranks_the_node_reading():
    """One line, the memory kill named in it: oom, not the lost-node reading."""
    (hit,) = findings("ERROR TaskSchedulerImpl: Lost executor 3 on n5: Container killed by YARN for exceeding "
                      "physical memory limits. 12.1 GB of 12 GB physical memory used.")
    assert hit.rule_id == "spark.yarn_memory_limit"
