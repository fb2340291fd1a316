"""The config model: one module per section, named for its key (pydantic, ``extra="forbid"``).

``model`` holds ``Config`` and ``load_config``; the sections are ``policy`` (with the AIMaster
flags), ``recovery``, ``mindcluster``, ``supervisor``, ``watch``, ``health``, ``storage``,
``metrics``, ``receivers``, ``routes``; ``yamlsource`` is the line-keeping YAML loader shared
with the rule files; ``reference`` renders the README's config reference.
"""
