"""Health checks (SPEC H1-H3): Bootcheck / Troubleshooting, the node check, runtime stragglers.

No stage: these modules import only the core (events, errors, clock) and top-level modules
(config). Torch is imported only by ``ftwatch.health.agent``, in child processes.
"""
