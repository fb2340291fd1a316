"""``ftwatch nodes``: the nodes the kubernetes actuator isolated, and readmitting one (issue 13).

``ftwatch nodes list`` prints one line per node that carries ftwatch's taint or its decision
annotation: name, cordoned or not, the taint, the decision id, when, and why.
``ftwatch nodes readmit NODE`` uncordons the node and removes the taint and the annotations.
Cluster access and the taint key come from ``--config``'s ``watch.actuator.kubernetes`` (the
defaults without one); ``--kubeconfig`` / ``--context`` override it.
"""

from __future__ import annotations

import sys

from ftwatch.cli.common import EXIT_FAILED, ArgumentParser


def cmd_nodes(argv: list[str]) -> int:
    """``ftwatch nodes list|readmit NODE``. Returns 0, or 1 when the API refused (the line says why)."""
    p = ArgumentParser(prog="ftwatch nodes", description="Nodes isolated by the kubernetes actuator.")
    p.add_argument("verb", choices=["list", "readmit"])
    p.add_argument("node", nargs="?", help="readmit: the node")
    p.add_argument("--config", help="YAML config whose watch.actuator.kubernetes section is used")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--dry-run", action="store_true", help="readmit: print the calls, send no write")
    args = p.parse_args(argv)
    if args.verb == "readmit" and not args.node:
        p.error("readmit needs a NODE")
    from ftwatch.config.model import Config, load_config
    from ftwatch.pipeline.actuators.kubeapi import KubeError
    from ftwatch.pipeline.actuators.kubernetes import KubernetesActuator
    kube = (load_config(args.config) if args.config else Config()).watch.actuator.kubernetes
    update = {k: v for k, v in (("kubeconfig", args.kubeconfig), ("context", args.context)) if v}
    if args.dry_run:
        update["dry_run"] = True
    actuator = KubernetesActuator(kube.model_copy(update=update))
    if args.verb == "list":
        try:
            nodes = actuator.isolated_nodes()
        except KubeError as exc:
            print(f"ftwatch nodes: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"{'NODE':<24} {'CORDONED':<9} {'DECISION':<17} {'ISOLATED AT':<25} REASON")
        for n in nodes:
            at = _iso(n["isolated_at"]) if n["isolated_at"] is not None else "-"
            print(f"{n['name']:<24} {'yes' if n['unschedulable'] else 'no':<9} {n['decision_id'] or '-':<17} "
                  f"{at:<25} {n['reason'] or n['taint'] or '-'}")
        return 0
    result = actuator.readmit(args.node)
    for line in result.output.splitlines():
        print(line)
    if result.status not in ("done", "dry_run"):
        print(f"ftwatch nodes: readmit {args.node} failed", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.node} readmitted" + (" (dry run: nothing sent)" if result.status == "dry_run" else ""))
    return 0


def _iso(t: float) -> str:
    from ftwatch.events import iso
    return iso(t)
