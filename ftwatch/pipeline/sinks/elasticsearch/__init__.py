"""The Elasticsearch sink (SPEC E2), one component: ``sink`` (the store's face, journal and
sender thread), ``ecs`` (documents, pure), ``ecsread`` (documents back to store rows, pure),
``buffer`` (disk journal and dead letters), ``client`` (the official client), ``setup`` (ILM,
templates, data streams)."""
