"""A small Hugging Face Hub-compatible HTTP server for the tests (standard library only, in memory).

It implements what the `huggingface_hub` 2.x client needs for `create_repo`, `create_branch`, `upload_folder` /
`create_commit` (preupload answers every file as `regular`, so contents arrive base64 in the NDJSON commit and no
LFS/Xet storage is needed), `model_info`, `list_repo_tree`, and `hf_hub_download` (HEAD/GET `resolve` with the
`X-Repo-Commit` and `ETag` headers), with the Hub's `X-Error-Code` values (`RepoNotFound`, `RevisionNotFound`,
`EntryNotFound`) so that the client raises its normal errors. Every commit is kept, so any past revision resolves.

    server = HubServer().start()      # server.endpoint == "http://127.0.0.1:<port>"; set HF_ENDPOINT to it
    ...
    server.stop()
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

USER = "test-user"


class _Repo:
    def __init__(self):
        self.commits: dict[str, dict[str, bytes]] = {}  # sha -> {path: content}
        self.branches: dict[str, str] = {}  # branch -> sha

        self.commit({}, "initial commit", parent=None, branch="main")

    def commit(self, files: dict[str, bytes], message: str, parent: str | None, branch: str) -> str:
        digest = hashlib.sha1(f"{parent}\n{message}\n{len(self.commits)}".encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + files[path])
        sha = digest.hexdigest()
        self.commits[sha] = files
        self.branches[branch] = sha
        return sha

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


class _Handler(BaseHTTPRequestHandler):
    server: _HubHTTPServer

    def log_message(self, format, *args):  # keep test output clean
        pass

    # ----------------------------------------------------------------------------------------------- helpers
    def send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, payload, headers: dict | None = None):
        self.send(status, json.dumps(payload).encode(), headers)

    def error(self, status: int, code: str, message: str):
        self.send_json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def repo(self, repo_id: str) -> _Repo | None:
        repo = self.server.repos.get(repo_id)
        if repo is None:
            self.error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
        return repo

    def revision(self, repo: _Repo, revision: str) -> str | None:
        sha = repo.resolve(revision)
        if sha is None:
            self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def route(self) -> tuple[list[str], dict]:
        parts = urlsplit(self.path)
        return [unquote(p) for p in parts.path.strip("/").split("/")], dict(
            kv.split("=", 1) for kv in parts.query.split("&") if "=" in kv
        )

    # ----------------------------------------------------------------------------------------------- verbs
    def do_GET(self):
        with self.server.lock:
            self.handle_read()

    def do_HEAD(self):
        with self.server.lock:
            self.handle_read()

    def do_POST(self):
        with self.server.lock:
            self.handle_write()

    def handle_read(self):
        segments, _ = self.route()
        if segments[:2] == ["api", "whoami-v2"]:
            return self.send_json(200, {"type": "user", "name": USER, "orgs": [], "auth": {"type": "access_token"}})
        if segments[:2] == ["api", "models"] and len(segments) >= 4:
            repo_id = "/".join(segments[2:4])
            repo = self.repo(repo_id)
            if repo is None:
                return
            rest = segments[4:]
            if not rest or rest[0] == "revision":
                sha = self.revision(repo, rest[1] if rest else "main")
                if sha is None:
                    return
                siblings = [{"rfilename": path} for path in sorted(repo.commits[sha])]
                return self.send_json(
                    200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "siblings": siblings}
                )
            if rest[0] == "tree":
                sha = self.revision(repo, rest[1])
                if sha is None:
                    return
                folder = "/".join(rest[2:]).strip("/")
                prefix = f"{folder}/" if folder else ""
                entries = [
                    {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for path, data in sorted(repo.commits[sha].items())
                    if path.startswith(prefix)
                ]
                if folder and not entries:
                    return self.error(404, "EntryNotFound", f"{folder} does not exist on {rest[1]}")
                return self.send_json(200, entries)
        if len(segments) >= 5 and segments[2] == "resolve":
            repo = self.repo("/".join(segments[:2]))
            if repo is None:
                return
            sha = self.revision(repo, segments[3])
            if sha is None:
                return
            path = "/".join(segments[4:])
            data = repo.commits[sha].get(path)
            if data is None:
                return self.error(404, "EntryNotFound", f"Entry not found: {path} at {segments[3]}")
            etag = f'"{hashlib.sha1(data).hexdigest()}"'
            return self.send(200, data, {"X-Repo-Commit": sha, "ETag": etag}, "application/octet-stream")
        self.server.unhandled.append(f"{self.command} {self.path}")
        self.error(404, "EntryNotFound", f"Not implemented by the test server: {self.command} {self.path}")

    def handle_write(self):
        segments, _ = self.route()
        payload = self.body()
        if segments == ["api", "validate-yaml"]:
            return self.send_json(200, {"errors": [], "warnings": []})
        if segments == ["api", "repos", "create"]:
            request = json.loads(payload)
            repo_id = f"{request.get('organization') or USER}/{request['name']}"
            url = {"url": f"{self.server.endpoint}/{repo_id}", "name": repo_id}
            if repo_id in self.server.repos:
                return self.send_json(409, {"error": "You already created this model repo", **url})
            self.server.repos[repo_id] = _Repo()
            return self.send_json(200, url)
        if segments[:2] == ["api", "models"] and len(segments) >= 6:
            repo = self.repo("/".join(segments[2:4]))
            if repo is None:
                return
            action, revision = segments[4], "/".join(segments[5:])
            if action == "branch":
                if revision in repo.branches:
                    return self.error(409, "BranchAlreadyExists", f"Branch {revision} already exists")
                start = json.loads(payload or b"{}").get("startingPoint") or "main"
                sha = self.revision(repo, start)
                if sha is not None:
                    repo.branches[revision] = sha
                    self.send_json(200, {})
                return
            sha = self.revision(repo, revision)
            if sha is None:
                return
            if action == "preupload":
                files = json.loads(payload)["files"]
                modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                return self.send_json(200, {"files": modes, "commitOid": sha})
            if action == "commit":
                return self.commit(repo, "/".join(segments[2:4]), revision, sha, payload)
        self.server.unhandled.append(f"{self.command} {self.path}")
        self.error(404, "EntryNotFound", f"Not implemented by the test server: {self.command} {self.path}")

    def commit(self, repo: _Repo, repo_id: str, revision: str, parent: str, payload: bytes):
        if revision not in repo.branches:
            return self.error(400, "BadRequest", f"Can only commit to a branch, not {revision}")
        files = dict(repo.commits[parent])
        message = ""
        for line in payload.decode().splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            key, value = entry["key"], entry["value"]
            if key == "header":
                message = value.get("summary", "")
            elif key == "file":
                if value.get("encoding") != "base64":
                    return self.error(400, "BadRequest", f"Unsupported encoding {value.get('encoding')}")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    return self.error(404, "EntryNotFound", f"A file with this name doesn't exist: {value['path']}")
            else:  # lfsFile, deletedFolder, copies: not needed by the tests (preupload never answers `lfs`)
                return self.error(400, "BadRequest", f"Commit operation {key!r} is not supported by the test server")
        sha = repo.commit(files, message, parent, revision)
        url = f"{self.server.endpoint}/{repo_id}/commit/{sha}"
        self.send_json(200, {"commitUrl": url, "commitOid": sha, "pullRequestUrl": None})


class _HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address):
        super().__init__(address, _Handler)
        self.repos: dict[str, _Repo] = {}
        self.lock = threading.Lock()
        self.unhandled: list[str] = []  # requests the server did not implement, for test diagnostics
        self.endpoint = f"http://{self.server_address[0]}:{self.server_address[1]}"


class HubServer:
    """Runs the server on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.httpd = _HubHTTPServer((host, port))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return self.httpd.endpoint

    @property
    def unhandled(self) -> list[str]:
        return self.httpd.unhandled

    def start(self) -> HubServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
