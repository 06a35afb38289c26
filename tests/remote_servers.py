"""Real servers on 127.0.0.1 for the remote-data tests and the benchmark: an HTTP file server with range
requests, ETags and If-Match (Python's http.server), an S3 server (moto's server mode), and a proxy in front
of either that injects faults (503 for the first tries, a dropped connection, a stall, a body cut short).

Used as `with http_server(folder) as url:`, `with s3_server() as endpoint:`, `with FaultProxy(upstream) as p:`.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class RangeHandler(SimpleHTTPRequestHandler):
    """Files of a folder with `Range: bytes=a-b` (206), a strong ETag of the file's size and mtime, If-Match
    (412 when it differs) and HEAD."""

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def send_head(self):  # noqa: ANN201 (the base class's contract: a file object or None)
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return None
        stat = path.stat()
        etag = '"' + hashlib.md5(f"{stat.st_size}-{stat.st_mtime_ns}".encode(), usedforsecurity=False).hexdigest() + '"'
        wanted = self.headers.get("If-Match")
        if wanted and wanted != "*" and etag not in [w.strip() for w in wanted.split(",")]:
            self.send_error(412)
            return None
        start, end = 0, stat.st_size
        found = _RANGE.fullmatch(self.headers.get("Range", ""))
        if found and (found.group(1) or found.group(2)):
            if found.group(1):
                start = int(found.group(1))
                end = min(stat.st_size, int(found.group(2)) + 1) if found.group(2) else stat.st_size
            else:
                start = max(0, stat.st_size - int(found.group(2)))
            if start >= stat.st_size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{stat.st_size}")
                self.end_headers()
                return None
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{stat.st_size}")
        else:
            self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.end_headers()
        handle = open(path, "rb")  # noqa: SIM115 (the base class closes it)
        handle.seek(start)
        self._left = end - start
        return handle

    def copyfile(self, source, outputfile) -> None:  # noqa: ANN001
        while self._left > 0:
            data = source.read(min(1 << 16, self._left))
            if not data:
                break
            outputfile.write(data)
            self._left -= len(data)


@contextlib.contextmanager
def http_server(folder: str | Path) -> Iterator[str]:
    """`folder` served on 127.0.0.1 (a free port); yields its base URL."""
    handler = lambda *a, **k: RangeHandler(*a, directory=str(folder), **k)  # noqa: E731
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port); yields its endpoint URL. Credentials: S3_ENV (in os.environ
    for this process and the subprocesses a test starts)."""
    from moto.server import ThreadedMotoServer

    os.environ.update(S3_ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def upload(endpoint: str, bucket: str, folder: str | Path, prefix: str) -> None:
    """Every file of `folder` into s3://bucket/prefix/ (the bucket made if needed)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in S3_ENV.items()
                                                          if k != "AWS_DEFAULT_REGION"}, region_name="us-east-1")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.name}")


class FaultProxy:
    """An HTTP proxy to `upstream` (http://host:port) whose rules inject faults into matching requests.

    rules: a list of dicts {"match": substring of the path, "fault": "503" | "drop" | "stall" | "truncate",
    "times": how many matching requests get it (None: all), "method": "GET" (default) or "HEAD"/"*"}.
    `hits` counts the faults injected per rule.
    """

    def __init__(self, upstream: str, rules: list[dict] | None = None, stall_seconds: float = 30.0) -> None:
        self.upstream, self.rules, self.stall_seconds = urlsplit(upstream), list(rules or []), stall_seconds
        self.hits = [0] * len(self.rules)
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self.lock = threading.Lock()

    def fault_for(self, method: str, path: str) -> str | None:
        with self.lock:
            self.requests.append((method, path))
            for number, rule in enumerate(self.rules):
                if rule["match"] in path and rule.get("method", "GET") in (method, "*") and \
                        (rule.get("times") is None or self.hits[number] < rule["times"]):
                    self.hits[number] += 1
                    return rule["fault"]
        return None

    def __enter__(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                fault = proxy.fault_for(self.command, self.path)
                if fault == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "stall":
                    time.sleep(proxy.stall_seconds)
                    self.close_connection = True
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                upstream.request(self.command, self.path, body=body, headers=headers)
                reply = upstream.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                for key, value in reply.getheaders():
                    if key.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                        self.send_header(key, value)
                declared = len(data) if self.command != "HEAD" else int(reply.getheader("Content-Length") or 0)
                self.send_header("Content-Length", str(declared))
                self.end_headers()
                if self.command != "HEAD":
                    if fault == "truncate":  # the full length declared, half of the body sent, then closed
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                    else:
                        self.wfile.write(data)
                upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
