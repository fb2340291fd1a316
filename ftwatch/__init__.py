"""ftwatch: the fault-tolerance monitor for distributed training jobs.

The four stages live under this one import package (``ftwatch.pipeline``, ``ftwatch.parsers``,
``ftwatch.rules``, ``ftwatch.alerting``) so that generic names never clash with a training
environment's own ``pipeline`` or ``rules`` modules (README "Layout").
"""

__version__ = "0.1.0"
