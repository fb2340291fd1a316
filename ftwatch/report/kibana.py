"""``ftwatch dashboards import``: the saved objects of ``dashboards/`` into Kibana (SPEC E3).

Kibana's saved-objects import API (Kibana docs "Import objects API"): ``POST
[/s/<space>]/api/saved_objects/_import?overwrite=true``, multipart form with the NDJSON in the
field ``file``, and the ``kbn-xsrf`` header (any value) that Kibana requires on every write.
``overwrite=true`` replaces objects of the same id, so importing again updates the dashboards in
place instead of copying them. Import works into the same or a newer Kibana only, never older.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from ftwatch.errors import FtwatchError


class KibanaError(FtwatchError):
    """Kibana refused the import, or could not be reached."""


@dataclass
class ImportResult:
    """What Kibana said: ``success``, ``success_count`` and the per-object ``errors``."""

    success: bool
    success_count: int
    errors: list[dict[str, Any]] = field(default_factory=list)


def import_url(kibana_url: str, space: str | None = None, overwrite: bool = True) -> str:
    """The import endpoint for a Kibana base URL and optional space id."""
    base = kibana_url.rstrip("/")
    if space and space != "default":
        base += f"/s/{space}"
    return f"{base}/api/saved_objects/_import" + ("?overwrite=true" if overwrite else "")


def import_objects(kibana_url: str, ndjson: str | bytes, *, space: str | None = None,
                   api_key: str | None = None, username: str | None = None, password: str | None = None,
                   verify: bool | str = True, timeout: float = 30.0,
                   client: httpx.Client | None = None) -> ImportResult:
    """Send saved objects to Kibana's import API with overwrite.

    Args:
        kibana_url: e.g. ``http://localhost:5601`` (a base path, if Kibana has one, included).
        ndjson: the saved objects, one JSON object a line.
        space: a Kibana space id; None or ``default``: the default space.
        api_key: sent as ``Authorization: ApiKey <api_key>``; or ``username``/``password``
            (basic auth).
        verify: check TLS certificates (or a CA bundle path).
        client: an ``httpx.Client`` to use (tests); made and closed here otherwise.

    Returns:
        ImportResult; ``success`` False when some objects were refused (``errors`` says which).

    Raises:
        KibanaError: no connection, or an answer other than 200 with a JSON body.
    """
    data = ndjson.encode() if isinstance(ndjson, str) else ndjson
    headers = {"kbn-xsrf": "ftwatch"}
    if api_key:
        headers["Authorization"] = f"ApiKey {api_key}"
    auth = (username, password or "") if username else None
    own = client is None
    http = client or httpx.Client(timeout=timeout, verify=verify)
    url = import_url(kibana_url, space)
    try:
        response = http.post(url, headers=headers, auth=auth,
                             files={"file": ("ftwatch.ndjson", data, "application/ndjson")})
    except httpx.HTTPError as exc:
        raise KibanaError(f"cannot reach Kibana at {kibana_url}: {exc}") from exc
    finally:
        if own:
            http.close()
    if response.status_code != 200:
        raise KibanaError(f"Kibana answered {response.status_code} to {url}: {response.text[:500]}")
    try:
        body = response.json()
    except ValueError:
        raise KibanaError(f"Kibana's answer is not JSON: {response.text[:200]}") from None
    return ImportResult(bool(body.get("success")), int(body.get("successCount", 0)),
                        list(body.get("errors") or []))
