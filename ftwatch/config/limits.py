"""The ``limits`` section: caps on the state a long-running ftwatch keeps (issue 17 item 3).

``ftwatch watch`` sees an open-ended stream of jobs, pods and streams; without caps its memory
grew with every info finding it kept as a job's evidence (~20 MB per 50,000). Each cap below
bounds one structure; what a cap drops is counted in ``ftwatch_state_evicted_total{kind}``
(``ftwatch.bounded``). The defaults are far above a healthy job's needs (a 1,024-node x 8-GPU
job is 8,192 instances), so they only bite on floods and churn:

=============================  ========================  ================================================
key                            kind counted              what is dropped, and which first
=============================  ========================  ================================================
``max_jobs``                   ``job``                   ``watch``'s per-job state (incident desk, SDK
                                                         handler, phase, metrics series): the job whose
                                                         output is the oldest; never one whose incident
                                                         is settling
``job_idle_seconds``           ``job_idle``              the same, for a job silent this long (no
                                                         incident open); it starts fresh if it speaks
``max_info_findings_per_job``  ``finding``               a job's info findings kept as evidence of the
                                                         current attempt: the oldest first (the policy
                                                         reads errors; of info lines only recent ones,
                                                         e.g. a launcher's "exited 0")
``max_findings_per_job``       ``finding``               all of a job's evidence of the current attempt:
                                                         the oldest info findings first (warnings,
                                                         errors and exits last); and the open
                                                         incident's openers: all but the earliest of
                                                         each instance, rule and class and the newest
                                                         (``triggers.trim_openers``)
``max_notices_per_job``        ``notice``                a job's notices of the current attempt (errors
                                                         its instances outlived, ``policy.progress``):
                                                         the oldest first, out of its evidence too
``max_instances_per_job``      ``instance``,             a job's instances, streams, hang timers and
                               ``hang_timer``,           per-rank step statistics: the least recently
                               ``straggler_rank``        active first
``max_open_blocks``            ``open_block``            multi-line blocks (tracebacks) carried to the
                                                         next chunk, over every origin: the oldest
                                                         closed early, as if its stream had gone quiet
``max_open_block_bytes``       ``open_block``            the same, by their bytes together
``max_tracked_instances``      ``device``, ``origin``    instances known across every job: the devices
                                                         their records named (for host lines), their
                                                         latest origin (the recorder's labels of
                                                         output rows); the earliest named first
``max_kept_decisions``         ``decision``              decisions and delivery results the recorder
                                                         keeps in memory (the store has them all)
``max_alert_groups``           ``alert_group``           the event center's alert groups (their timing
                                                         and repeats): the one idle longest first (its
                                                         repeats stop); a group whose alerts still wait
                                                         is sent early instead, never dropped
``forward_chunks_kept``        (not counted)             the Forward chunk ids the store keeps to skip a
                                                         chunk sent again (table ``chunks``): the oldest
``forward_chunk_seconds``      (not counted)             the same, by age
``max_remembered_alerts``      ``inhibit_source``,       firing alerts the event center remembers: as
                               ``unsent_alert``          inhibit sources, and (muted or inhibited when
                                                         they fired) to hold back their resolution:
                                                         the oldest first
``budget_retention``           ``budget_file``           ``watch``: the budget files of jobs it keeps no
                                                         state for (``<state_dir>/budgets``, a file per
                                                         job ever met) not written for this long
=============================  ========================  ================================================

A finished job's state goes with its decision: a ``fail_job`` drops the desk at once (the
decision is stored first), a job that ends by itself is dropped once idle.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ftwatch.config.routes import Duration

MAX_INSTANCES_PER_JOB = 16384
MAX_TRACKED_INSTANCES = 262144
MAX_NOTICES_PER_JOB = 1000
MAX_FINDINGS_PER_JOB = 20000
MAX_ALERT_GROUPS = 10000
MAX_REMEMBERED_ALERTS = 10000


class LimitsConfig(BaseModel):
    """Caps on per-job, per-instance and per-stream state (``ftwatch_state_evicted_total``)."""

    model_config = ConfigDict(extra="forbid")
    max_jobs: int = Field(10000, gt=0, description="Jobs ftwatch watch keeps state for; one more "
                          "drops the job whose output is the oldest (none with an incident settling).")
    job_idle_seconds: float = Field(3600.0, gt=0, description="A watched job silent this long (and "
                                    "with no incident open) is forgotten; it starts fresh if it speaks.")
    max_info_findings_per_job: int = Field(1000, gt=0, description="Info findings (below warning, "
                                           "not exits) kept as one job's evidence per attempt; past it "
                                           "the oldest go.")
    max_findings_per_job: int = Field(MAX_FINDINGS_PER_JOB, gt=0, description="Findings kept as one job's evidence per "
                                      "attempt; past it the oldest info findings go first, then the "
                                      "oldest of the rest. Also bounds the open incident's openers.")
    max_notices_per_job: int = Field(MAX_NOTICES_PER_JOB, gt=0, description="Notices (errors the job "
                                     "outlived) kept for one job's attempt; past it the oldest are "
                                     "forgotten, out of its evidence too.")
    max_instances_per_job: int = Field(MAX_INSTANCES_PER_JOB, gt=0, description="Instances (and their "
                                       "streams, hang timers and step statistics) kept per job; the "
                                       "least recently active goes first.")
    max_open_blocks: int = Field(4096, gt=0, description="Open multi-line blocks carried over, all "
                                 "origins together; past it the oldest is closed where it is.")
    max_open_block_bytes: int = Field(256 << 20, gt=0, description="Bytes of those open blocks together; "
                                      "past it the oldest are closed where they are.")
    max_tracked_instances: int = Field(MAX_TRACKED_INSTANCES, gt=0, description="Instances whose devices "
                                       "(PCI bus ids, for host lines) and latest labels (for output counts) are "
                                       "known, over every job; the earliest named goes first.")
    max_kept_decisions: int = Field(10000, gt=0, description="Decisions and delivery results kept in "
                                    "memory (the store keeps every one); the oldest go first.")
    max_alert_groups: int = Field(MAX_ALERT_GROUPS, gt=0, description="Alert groups (their timing and "
                                  "repeats) kept; past it the group idle longest goes (its repeats stop), "
                                  "or, when every group has alerts waiting, the oldest is sent early.")
    forward_chunks_kept: int = Field(1_000_000, gt=0, description="Forward chunk ids stored (with the "
                                     "batch that handled them) so that a chunk sent again after a kill is "
                                     "acked and skipped; past it the oldest go.")
    forward_chunk_seconds: float = Field(3600.0, gt=0, description="How long a Forward chunk id is kept; "
                                         "a chunk sent again later than this is judged again.")
    max_remembered_alerts: int = Field(MAX_REMEMBERED_ALERTS, gt=0, description="Firing alerts remembered "
                                       "as inhibit sources, and as muted or inhibited (their resolution held "
                                       "back), each; past it the oldest are forgotten.")
    budget_retention: Duration | None = Field(
        90 * 86400.0, gt=0, description="ftwatch watch: delete the budget file (state_dir/budgets) of a job it "
        "keeps no state for once the file has not been written for this long (e.g. 90d; checked hourly); "
        "null: keep every file. The default matches storage.sqlite_retention.")
