"""The HTTP server of ``trainwell report --watch``: the page and its data, to whoever holds the token only.

Owns answering requests; what it serves comes from ``trainwell.report.watch`` (the data) and
``trainwell.report.watch_page`` (the page). It listens on 127.0.0.1 only, and that alone does not keep the data
private: any local account can connect to a loopback port. So, as Jupyter does, the server has a token (random,
``secrets.token_urlsafe``, or the one given) that is part of the printed address: ``/`` and ``/data`` answer 403
without it, and the page's script passes it on with each of its data requests. A request whose ``Host`` is not
this machine's loopback name is refused too (a web page elsewhere cannot read the data through DNS rebinding).
Only ``GET`` (and ``HEAD``) is answered. A connection that sends nothing for ``IDLE_TIMEOUT`` seconds is closed,
and at most ``MAX_CONNECTIONS`` are served at once (one more is closed at once), so idle connections cannot pile
up threads.
"""

from __future__ import annotations

import hmac
import http.server
import re
import secrets
import socket
import sys
import threading
import urllib.parse
from typing import Any, Protocol

#: seconds a connection may stay silent (while its request is read or answered) before the server closes it
IDLE_TIMEOUT = 15.0
#: connections served at once; one more is closed at once (the page makes one request a second)
MAX_CONNECTIONS = 32
#: what a token given with ``--token`` may hold: it is part of the page's address
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~-]{16,200}")


class DataSource(Protocol):
    def payload(self, since: int | None) -> bytes: ...


def new_token() -> str:
    """A fresh random token (32 URL-safe characters, 192 bits)."""
    return secrets.token_urlsafe(24)


def check_token(token: str) -> str:
    """``token`` when it can serve as one; ``ValueError`` saying why not."""
    if not TOKEN_PATTERN.fullmatch(token):
        raise ValueError(f"--token {token[:40]!r}: a token is 16 to 200 characters among letters, digits and . _ ~ - "
                         "(it goes into the page's address); leave --token out for a random one.")
    return token


class _Handler(http.server.BaseHTTPRequestHandler):
    server: WatchServer
    server_version = "trainwell-watch"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout  # StreamRequestHandler puts it on the socket: a silent client ends
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # no line per request on the console

    def _send(self, code: int, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        headers = {"Content-Type": kind, "Content-Length": str(len(body)), "Cache-Control": "no-store",
                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                   "X-Frame-Options": "DENY", **(extra or {})}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refuse(self, code: int, why: str) -> None:
        self._send(code, (why + "\n").encode(), "text/plain; charset=utf-8")

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        if not self.server.host_allowed(self.headers.get("Host")):
            self._refuse(403, "this page answers only requests to 127.0.0.1 or localhost")
            return
        path, _, query = self.path.partition("?")
        if path not in ("/", "/data"):
            self._refuse(404, "not found: this server has / and /data only")
            return
        try:
            fields = urllib.parse.parse_qs(query, max_num_fields=4)
        except ValueError:
            self._refuse(400, "too many query fields: the page sends since= and token= only")
            return
        if not self.server.token_matches(fields.get("token", [""])[-1]):
            self._refuse(403, "this page needs its token: open the address `trainwell report --watch` printed "
                              "(http://127.0.0.1:PORT/?token=...)")
            return
        if path == "/":
            from trainwell.report.watch_page import page

            nonce = secrets.token_urlsafe(16)
            csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; "
                   "img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
            self._send(200, page(nonce).encode(), "text/html; charset=utf-8", {"Content-Security-Policy": csp})
            return
        since = fields.get("since", [""])[-1]
        version = int(since) if re.fullmatch(r"-?\d{1,18}", since) else None
        self._send(200, self.server.watcher.payload(version), "application/json; charset=utf-8")

    do_HEAD = do_GET

    def _read_only(self) -> None:
        self._refuse(405, "read-only: only GET is answered")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _read_only


class WatchServer(http.server.ThreadingHTTPServer):
    """The HTTP server on 127.0.0.1 (``port`` 0: a free one, chosen by the system) serving ``watcher``'s data to
    requests carrying ``token`` (a random one when None)."""

    daemon_threads = True

    def __init__(self, watcher: DataSource, port: int = 0, token: str | None = None,
                 idle_timeout: float = IDLE_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.watcher = watcher
        self.token = check_token(token) if token is not None else new_token()
        self.idle_timeout = idle_timeout
        self.port = self.server_address[1]
        self._hosts = {f"{name}:{self.port}" for name in ("127.0.0.1", "localhost", "[::1]")}
        self._slots = threading.BoundedSemaphore(max_connections)

    @property
    def url(self) -> str:
        """The page's address, its token included."""
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    def host_allowed(self, host: str | None) -> bool:
        return host is not None and host.lower() in self._hosts

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())  # in constant time

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client gone mid-answer: no traceback on the console
            super().handle_error(request, client_address)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # all slots taken: this one is closed, no thread for it
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


__all__ = ["IDLE_TIMEOUT", "MAX_CONNECTIONS", "WatchServer", "check_token", "new_token"]
