"""A local stand-in for the Hugging Face Hub's HTTP API, enough for ``create_repo`` and ``upload_folder``.

The tests point ``huggingface_hub`` at it (its endpoint is configurable), so pushes run through the real
client without reaching a network. Every file is declared a regular (non-LFS) upload, so the client sends
the contents inline in the commit; the server keeps, per repository, the commits it received in order.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Commit:
    repo_id: str
    revision: str
    message: str
    files: dict[str, bytes] = field(default_factory=dict)


class FakeHub:
    """Start with ``with FakeHub() as hub:``; ``hub.url`` is the endpoint, ``hub.commits`` what was pushed.

    ``fail_commits=True`` answers every commit with HTTP 500 (a Hub outage); ``commit_delay`` seconds of
    sleep before each commit answer stand for a slow upload.
    """

    def __init__(self, fail_commits: bool = False, commit_delay: float = 0.0, user: str = "tester") -> None:
        self.user, self.fail_commits, self.commit_delay = user, fail_commits, commit_delay
        self.repos: dict[str, dict] = {}
        self.commits: list[Commit] = []
        self.validated: list[dict] = []  # the model-card metadata headers the client sent for validation
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The repository's files after every commit so far (later commits overwrite earlier ones)."""
        out: dict[str, bytes] = {}
        for commit in self.commits:
            if commit.repo_id == repo_id and commit.revision == revision:
                out.update(commit.files)
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep the test output quiet
                pass

            def _reply(self, code: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "repos", "create"]:
                    request = json.loads(body)
                    repo_id = f"{request.get('organization') or hub.user}/{request['name']}"
                    with hub.lock:
                        hub.repos.setdefault(repo_id, request)
                    return self._reply(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})
                if parts[:2] == ["api", "validate-yaml"]:  # a README.md's metadata header, as the Hub checks it
                    return self._validate_yaml(json.loads(body)["content"])
                if parts[:2] == ["api", "models"] and "preupload" in parts:
                    files = json.loads(body)["files"]
                    answer = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                    return self._reply(200, {"files": answer})
                if parts[:2] == ["api", "models"] and "commit" in parts:
                    at = parts.index("commit")
                    return self._commit("/".join(parts[2:at]), "/".join(parts[at + 1:]), body)
                return self._reply(404, {"error": f"fake hub: no route for POST {self.path}"})

            def _validate_yaml(self, content: str) -> None:  # the client sends the whole README.md
                import yaml

                if not content.startswith("---"):
                    return self._reply(200, {"warnings": [{"message": "empty or missing yaml metadata"}]})
                try:
                    header = yaml.safe_load(content.split("---")[1])
                except yaml.YAMLError as err:
                    return self._reply(400, {"errors": [{"message": f"invalid YAML: {err}"}]})
                if not isinstance(header, dict):
                    return self._reply(400, {"errors": [{"message": "metadata is not a mapping"}]})
                hub.validated.append(header)
                return self._reply(200, {"warnings": []})

            def _commit(self, repo_id: str, revision: str, body: bytes) -> None:
                if hub.commit_delay:
                    time.sleep(hub.commit_delay)
                if hub.fail_commits:
                    return self._reply(500, {"error": "fake hub: outage"})
                if repo_id not in hub.repos:
                    return self._reply(404, {"error": f"Repository {repo_id} not found"})
                commit = Commit(repo_id, revision, "")
                for line in body.decode().splitlines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    if item["key"] == "header":
                        commit.message = item["value"]["summary"]
                    elif item["key"] == "file":
                        commit.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                with hub.lock:
                    hub.commits.append(commit)
                oid = f"{len(hub.commits):040x}"
                self._reply(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid})

        return Handler
