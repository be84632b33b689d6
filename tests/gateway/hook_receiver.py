"""A hostile webhook receiver, run as its own process (`python -m
tests.gateway.hook_receiver PORT`): it answers deliveries (POST /hooks) with 204,
or, for the next few, with 200 and a body that floods (megabytes as fast as the
socket takes them) or trickles (a byte at a time, for longer than a lease).

    POST /mode        {"mode": "flood"|"trickle", "times": n, "bytes": b,
                       "every_s": s, "count": c}: how the next n deliveries are answered
    GET  /deliveries  every delivery so far, in the order they arrived: event id,
                      attempt, how it was answered, the bytes of answer written,
                      whether the whole answer was written (False: the gateway hung
                      up), whether its handling is over (`done`), and the most
                      deliveries ever in flight at once
    GET  /ready       200
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHUNK = 1 << 20


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mode: dict[str, Any] = {}
        self.times = 0
        self.deliveries: list[dict[str, Any]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def start(self, record: dict[str, Any]) -> dict[str, Any]:
        """How to answer the delivery `record` stands for, recorded as it arrives: a
        flood the gateway cut short may notice the hang-up after the next delivery
        was answered, and a record made at the end would come second."""
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            mode = {"mode": "take"}
            if self.times > 0:
                self.times -= 1
                mode = dict(self.mode)
            record["mode"] = mode["mode"]
            self.deliveries.append(record)
            return mode

    def done(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.in_flight -= 1
            record["done"] = True


STATE = State()


def hung_up(connection: socket.socket, wait_s: float) -> bool:
    """Whether the peer closed the connection, waiting up to `wait_s` to hear it (the
    gateway sends nothing else while it waits for this answer: readable means closed)."""
    readable, _, _ = select.select([connection], [], [], wait_s)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ready":
            self._json(200, {"ready": True})
        elif self.path == "/deliveries":
            with STATE.lock:
                doc = {"deliveries": STATE.deliveries, "most_in_flight": STATE.most_in_flight}
                self._json(200, doc)
        else:
            self._json(404, {})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/mode":
            mode = json.loads(body)
            with STATE.lock:
                STATE.mode, STATE.times = mode, int(mode["times"])
            self._json(200, mode)
            return
        record: dict[str, Any] = {
            "id": self.headers.get("Irrev-Event-Id"),
            "attempt": int(self.headers.get("Irrev-Delivery-Attempt") or 0),
            "mode": "",
            "written": 0,
            "complete": False,
            "done": False,
        }
        mode = STATE.start(record)
        try:
            if mode["mode"] == "take":
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.wfile.flush()
            else:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                if mode["mode"] == "flood":
                    while record["written"] < mode["bytes"]:
                        self.wfile.write(b"%x\r\n" % CHUNK + b"A" * CHUNK + b"\r\n")
                        record["written"] += CHUNK
                else:
                    for _ in range(mode["count"]):
                        if hung_up(self.connection, mode["every_s"]):
                            raise ConnectionResetError("the gateway hung up")
                        self.wfile.write(b"1\r\nA\r\n")
                        self.wfile.flush()
                        record["written"] += 1
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            record["complete"] = True
        except OSError:
            self.close_connection = True
        finally:
            STATE.done(record)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()
