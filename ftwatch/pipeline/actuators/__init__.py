"""Carrying decisions out: ``local`` (the workers of ``ftwatch run``), ``exec`` (a hook for
``ftwatch watch``), ``kubernetes`` and ``slurm`` (a cluster's own scheduler acts; ``outcome``
stores what it did with the decision), ``slots`` (devices per worker slot, isolation), ``scene`` (keep-scene text),
``recovery`` (MindCluster retry and dump watches)."""
