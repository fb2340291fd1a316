"""Carrying decisions out: ``local`` (the workers of ``ftwatch run``), ``exec`` (a hook for
``ftwatch watch``), ``slots`` (devices per worker slot, isolation), ``scene`` (keep-scene text),
``recovery`` (MindCluster retry and dump watches)."""
