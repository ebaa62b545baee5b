"""Upload the dashboards into a running Grafana with grafana-client: find the folder by title
(``GET /api/search?type=dash-folder``), create it when missing (``POST /api/folders``), then
``POST /api/dashboards/db`` each dashboard with ``overwrite: true`` into that folder.

Authentication: a service-account token (``--token`` or ``GRAFANA_TOKEN``), else the user and
password of the URL (``http://admin:admin@grafana:3000``), else none (anonymous admin).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from grafana_client import GrafanaApi

log = logging.getLogger(__name__)

DEFAULT_FOLDER = "llm-inference-lab"


def folder_uid_for(title: str) -> str:
    """The uid a created folder gets: its title in lower case, non-alphanumerics as '-', 40 chars."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40] or "llmlab"


def ensure_folder(api: GrafanaApi, title: str) -> str:
    """The uid of the folder called ``title``, created when there is none."""
    hits = api.search.search_dashboards(query=title, type_="dash-folder") or []
    for hit in hits:
        if hit.get("title") == title:
            return str(hit["uid"])
    created = api.folder.create_folder(title, uid=folder_uid_for(title))
    log.info("created folder %r (uid %s)", title, created["uid"])
    return str(created["uid"])


def import_dashboards(
    url: str,
    dashboards: Mapping[str, dict[str, Any]],
    *,
    token: str | None = None,
    folder: str = DEFAULT_FOLDER,
    timeout: float = 10.0,
) -> list[str]:
    """Upload every dashboard (overwriting any with the same uid); returns one line per dashboard."""
    parsed = urlsplit(url)
    if parsed.path and not parsed.path.endswith("/"):  # grafana-client appends "api" to the path as is
        url = urlunsplit(parsed._replace(path=parsed.path + "/"))
    api = GrafanaApi.from_url(url, credential=token or None, timeout=timeout)
    folder_uid = ensure_folder(api, folder)
    lines = []
    for name, data in dashboards.items():
        body = {
            # No id: Grafana matches on uid, so a re-import overwrites the same dashboard.
            "dashboard": {**data, "id": None},
            "folderUid": folder_uid,
            "overwrite": True,
            "message": f"llmlab_lab.dashboards import ({name})",
        }
        answer = api.dashboard.update_dashboard(body)
        lines.append(f"{name} -> {folder}/{data.get('uid')} ({answer.get('status', 'ok')}, {answer.get('url', '')})")
    return lines
