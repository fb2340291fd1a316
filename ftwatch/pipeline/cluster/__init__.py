"""A job over several nodes: one ``ftwatch run`` agent per node, one decision for the whole job.

The agents meet at PyTorch's c10d ``TCPStore`` (torchrun's ``--rdzv-backend c10d``), one job's
keys under ``ftwatch/<run id>/``, values msgpack (``store.py``, which also serves the store in a
process of its own). Modules, one job each:

    store.py        the store: client, server process, the msgpack key-value view
    rendezvous.py   generation g's world: who arrives, when the leader closes it, rank layout
    leader.py       election and the job's decisions through the incident core (IncidentDesk)
    agent.py        this node's link, called by the run loop (join / poll / decide / close)
    nodecheck.py    ``--network-check`` across the agents (SPEC H2, seed 003)
    handover.py     ``--actuator slurm``: the leader tells the job's scheduler once per decision

Keys (``<g>`` a generation, ``<n>`` a node id, ``<k>`` a counter):

    next_node               node ids given out by arrival (c10d, no ``--node-rank``)
    host/<n>                the node's host name
    hb/<n>                  its heartbeat counter (a thread adds 1 each ``heartbeat`` seconds)
    done/<n>                the node's exit status once its agent ended (not lost)
    leader                  ``"<n>:<token>"`` of the leader (compare-and-set)
    gen                     the generation being formed or run
    join/<g>/<n>            the node arrived for g: address, a free port, worker count
    world/<g>               g's world: nodes in group-rank order, worker counts, MASTER_ADDR/PORT
    left/<n>                why the node was left out (node check)
    reports/<g>/<n>         count of the node's reports in g;  report/<g>/<n>/<k>: one report
    decided/<g>, decision/<g>   the job's decision that ends g (claimed once), what each node does
    answer/<g>/<n>/<k>      a decision that stops nothing, answering one report
    check/...               the node check's requests and answers (nodecheck.py)
    sched/<n>, stopped/<g>/<n>, acting/<g>, step/<g>/<what>, acted/<g>
                            the scheduler's act on decision g, once for the job (handover.py)

A generation ends with one decision (restart, exclude a node, fail) and the next one is formed
by the nodes the decision kept; TORCHELASTIC_RESTART_COUNT counts them on each node.
"""
