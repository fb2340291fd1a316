"""The circuit breaker on node isolation (issue 13): a fault that looks like a bad node on many
nodes at once is more likely the job, the network or ftwatch itself, and isolating half a
cluster would do more harm than the fault. NVIDIA NVSentinel's default is kept: at most 50 %
of the nodes in 5 minutes.
"""

from __future__ import annotations

import math
from typing import Mapping


class NodeBreaker:
    """Counts the nodes isolated in a sliding window and holds the one beyond the limit.

    The nodes counted are those this process isolated (dry runs included) and those the cluster
    shows isolated (the ``isolated-at`` annotation, so a restarted ftwatch still counts them).

    Args:
        max_share: share of all nodes that may be isolated in a window (0 < share <= 1).
        max_nodes: absolute cap per window, or None.
        window: seconds.
    """

    def __init__(self, max_share: float = 0.5, max_nodes: int | None = None, window: float = 300.0):
        self.max_share = max_share
        self.max_nodes = max_nodes
        self.window = window
        self.recent: dict[str, float] = {}    # node -> when this process isolated it (epoch s)

    def limit(self, total_nodes: int) -> int:
        """How many nodes may be isolated in one window in a cluster of ``total_nodes``."""
        limit = math.floor(self.max_share * total_nodes + 1e-9)
        return limit if self.max_nodes is None else min(limit, self.max_nodes)

    def check(self, node: str, now: float, total_nodes: int,
              isolated_at: Mapping[str, float] | None = None) -> str | None:
        """None when ``node`` may be isolated now, else why not (one sentence).

        Args:
            node: the node to isolate.
            now: epoch seconds.
            total_nodes: nodes in the cluster.
            isolated_at: node -> when the cluster says it was isolated (epoch seconds).
        """
        seen = {**(isolated_at or {}), **self.recent}
        within = sorted(n for n, t in seen.items() if n != node and now - t < self.window)
        limit = self.limit(total_nodes)
        if len(within) < limit:
            return None
        cap = f"{self.max_share:.0%} of {total_nodes} nodes"
        if self.max_nodes is not None:
            cap += f", at most {self.max_nodes}"
        return (f"circuit breaker open: {len(within)} node(s) isolated in the last {self.window:g} s "
                f"({', '.join(within) or 'none'}), the limit is {limit} ({cap}); {node} is not isolated, "
                f"the decision is notified only")

    def record(self, node: str, now: float) -> None:
        """``node`` was isolated at ``now``."""
        self.recent = {n: t for n, t in self.recent.items() if now - t < self.window}
        self.recent[node] = now
