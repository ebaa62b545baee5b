"""The dashboards' HTTP commands against small local servers: ``import`` against a fake Grafana that
implements the three endpoints grafana-client calls (no Grafana server can run on these machines),
``snapshot`` against a fake Prometheus ``/api/v1/query_range``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from llmlab_lab.dashboards import __main__ as cli
from llmlab_lab.dashboards import build, spec

pytestmark = pytest.mark.integration


@dataclass
class Recorder:
    requests: list[dict[str, Any]] = field(default_factory=list)
    folders: list[dict[str, Any]] = field(default_factory=list)  # what /api/search finds
    status: int = 200  # of POST /api/dashboards/db

    def calls(self, method: str, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method and r["path"] == path]


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    recorder: Recorder

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: object) -> tuple[str, dict[str, list[str]]]:
        url = urlsplit(self.path)
        self.recorder.requests.append(
            {
                "method": self.command,
                "path": url.path,
                "query": parse_qs(url.query),
                "auth": self.headers.get("Authorization"),
                "body": body,
            }
        )
        return url.path, parse_qs(url.query)


@pytest.fixture
def grafana() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()

    class Grafana(_Handler):
        def do_GET(self) -> None:
            path, query = self._record(None)
            if path == "/api/search" and query.get("type") == ["dash-folder"]:
                wanted = query.get("query", [""])[0].lower()
                self._reply(200, [f for f in recorder.folders if wanted in f["title"].lower()])
            else:
                self._reply(404, {"message": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            path, _ = self._record(body)
            if path == "/api/folders":
                folder = {"id": 7, "uid": body.get("uid") or "generated", "title": body["title"]}
                recorder.folders.append({**folder, "type": "dash-folder"})
                self._reply(200, folder)
            elif path == "/api/dashboards/db":
                uid = body["dashboard"]["uid"]
                if recorder.status != 200:
                    self._reply(recorder.status, {"message": "denied"})
                    return
                self._reply(200, {"id": 1, "uid": uid, "status": "success", "url": f"/d/{uid}/x", "version": 1})
            else:
                self._reply(404, {"message": "not found"})

    Grafana.recorder = recorder
    for url in _serve(Grafana):
        yield url, recorder


def test_import_creates_the_folder_and_uploads_every_dashboard_with_overwrite(
    grafana: tuple[str, Recorder], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, rec = grafana
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_test")
    assert cli.main(["import", "--url", url, "--folder", "LLM Lab"]) == 0
    (search,) = rec.calls("GET", "/api/search")
    assert search["query"]["type"] == ["dash-folder"] and search["query"]["query"] == ["LLM Lab"]
    (created,) = rec.calls("POST", "/api/folders")
    assert created["body"] == {"title": "LLM Lab", "uid": "llm-lab"}
    uploads = rec.calls("POST", "/api/dashboards/db")
    expected = build.build_dashboards()
    assert [u["body"]["dashboard"]["uid"] for u in uploads] == [d["uid"] for d in expected.values()]
    for upload, want in zip(uploads, expected.values(), strict=True):
        body = upload["body"]
        assert body["overwrite"] is True and body["folderUid"] == "llm-lab"
        assert body["dashboard"]["id"] is None
        assert {k: v for k, v in body["dashboard"].items() if k != "id"} == {k: v for k, v in want.items() if k != "id"}
    assert {r["auth"] for r in rec.requests} == {"Bearer glsa_test"}
    out = capsys.readouterr().out
    assert all(f"{name} -> LLM Lab/" in out for name in expected)


def test_import_reuses_an_existing_folder_and_the_url_credentials(grafana: tuple[str, Recorder]) -> None:
    url, rec = grafana
    rec.folders.append({"id": 3, "uid": "existing", "title": "llm-inference-lab", "type": "dash-folder"})
    rec.folders.append({"id": 4, "uid": "other", "title": "llm-inference-lab (old)", "type": "dash-folder"})
    with_user = url.replace("http://", "http://admin:secret@")
    assert cli.main(["import", "--url", with_user]) == 0
    assert rec.calls("POST", "/api/folders") == []
    uploads = rec.calls("POST", "/api/dashboards/db")
    assert len(uploads) == len(spec.DASHBOARDS)
    assert {u["body"]["folderUid"] for u in uploads} == {"existing"}
    assert {u["body"]["overwrite"] for u in uploads} == {True}
    assert {r["auth"] for r in rec.requests} == {"Basic YWRtaW46c2VjcmV0"}


def test_import_fails_loudly(grafana: tuple[str, Recorder], capsys: pytest.CaptureFixture[str]) -> None:
    url, rec = grafana
    rec.status = 403
    assert cli.main(["import", "--url", url, "--token", "t"]) == 1
    assert "failed" in capsys.readouterr().err
    assert cli.main(["import", "--url", "http://127.0.0.1:9", "--timeout", "2"]) == 1


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Prometheus(_Handler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            q = parse_qs(url.query)
            if url.path != "/api/v1/query_range":
                self._reply(404, {"status": "error", "error": "not found"})
                return
            expr, start, end, step = q["query"][0], float(q["start"][0]), float(q["end"][0]), float(q["step"][0])
            seen.append(expr)
            if "DCGM" in expr:
                self._reply(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
                return
            values = [[start + i * step, str(0.1 + 0.01 * i)] for i in range(int((end - start) / step) + 1)]
            result = [{"metric": {"pool": "vllm"}, "values": values}]
            self._reply(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})

    for url in _serve(Prometheus):
        yield url, seen


def test_snapshot_queries_every_panel_and_prints_the_files(
    prometheus: tuple[str, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, seen = prometheus
    out = tmp_path / "dashboards"
    argv = ["snapshot", "--prometheus", url, "--start", "1780000000", "--end", "1780000600", "--out", str(out)]
    assert cli.main(argv) == 0
    assert sorted(seen) == sorted(e for q in spec.panels(range_s=600) for e in q.exprs)  # $__range: the window
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(str(p) for p in out.glob("*.png"))
    assert len(printed) == sum(len(d.rows) for d in spec.DASHBOARDS)


def test_snapshot_exits_non_zero_when_a_query_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Broken(_Handler):
        def do_GET(self) -> None:
            self._reply(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})

    for url in _serve(Broken):
        assert cli.main(["snapshot", "--prometheus", url, "--last", "5m", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "bad_data: parse error" in err
