"""The policy stage: findings of one incident -> one Decision (SPEC D1-D5, R3, R7, R8).

``policy`` (modes, policies, the decision), ``rootcause`` (root cause versus fallout),
``budgets`` (restart budgets, persisted), ``escalation`` (NPU fault frequency), ``modelarts``
(D4 strategies), ``c4d`` (C4D records), ``blame`` (node blame across jobs), ``triggers`` (which
findings open an incident), ``statefile`` (atomic JSON state files).
"""
