"""examples/notify/ through a real Notifier: curl to a local HTTP server, sendmail (msmtp) to a local SMTP server.

The servers are this test's own, on 127.0.0.1; the programs are real (curl; Debian's ``msmtp-mta`` as
``sendmail``). ``notify-send`` needs a desktop session, which no test machine has: a stand-in on PATH
records the arguments it gets instead.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.supervise.notify.test_notifier import Failures
from tests.supervised import REPO, program
from trainbox.supervise.notify import events
from trainbox.supervise.notify.notifier import Notifier

EXAMPLES = REPO / "examples" / "notify"
GIVE_UP = {"ts": 1795562400.5, "event": "give_up", "attempt": 3, "reason": "restart budget spent", "restarts": 3}


class Requests:
    """What a local HTTP server was sent, and the status it answers with."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.seen: List[Tuple[str, Dict[str, str], bytes]] = []


@pytest.fixture
def http_server() -> Iterator[Tuple[str, Requests]]:
    requests = Requests(200)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            requests.seen.append((self.path, dict(self.headers), body))
            self.send_response(requests.status)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


def deliver(command: List[str], event: dict, env: Dict[str, str]) -> Failures:
    failures = Failures()
    notifier = Notifier(command, events.DEFAULT_EVENTS, failures, env=env)
    notifier.send(event)
    notifier.close(timeout=events.LIMIT_S + 5)
    return failures


def test_webhook_posts_the_event_json(http_server: Tuple[str, Requests]) -> None:
    program("curl", package="curl")
    url, requests = http_server
    failures = deliver([str(EXAMPLES / "webhook.sh"), url + "/hook"], GIVE_UP, {})

    assert failures.seen == []
    ((path, headers, body),) = requests.seen
    assert path == "/hook" and headers["Content-Type"] == "application/json" and headers["X-Trainbox-Event"] == "give_up"
    assert json.loads(body) == GIVE_UP


def test_ntfy_pushes_the_summary_with_a_title_and_priority(http_server: Tuple[str, Requests]) -> None:
    program("curl", package="curl")
    url, requests = http_server
    failures = deliver([str(EXAMPLES / "ntfy.sh"), "my-topic"], GIVE_UP, {"NTFY_URL": url})

    assert failures.seen == []
    ((path, headers, body),) = requests.seen
    assert path == "/my-topic" and headers["Title"] == "trainbox: give_up" and headers["Priority"] == "high"
    assert body.decode() == "give_up, attempt 3: reason restart budget spent"


def test_a_webhook_that_answers_an_error_is_reported_with_curls_line(http_server: Tuple[str, Requests]) -> None:
    program("curl", package="curl")
    url, requests = http_server
    requests.status = 500
    failures = deliver([str(EXAMPLES / "webhook.sh"), url], GIVE_UP, {})

    assert failures.kinds() == ["status"]
    assert "failed on give_up (status 22): curl: (22) The requested URL returned error: 500" in failures.seen[0][1]


class _Smtp(socketserver.StreamRequestHandler):
    """Just enough SMTP (RFC 5321) to take one message: every command is accepted, DATA is kept."""

    def handle(self) -> None:
        self.wfile.write(b"220 test ESMTP\r\n")
        while True:
            line = self.rfile.readline()
            verb = line[:4].upper()
            if not line or verb == b"QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            if verb == b"DATA":
                self.wfile.write(b"354 go on\r\n")
                self.server.messages.append(b"".join(iter(self.rfile.readline, b".\r\n")))  # type: ignore[attr-defined]
            self.wfile.write(b"250 ok\r\n")


def test_mail_sends_the_event_through_the_local_sendmail(tmp_path: Path) -> None:
    program("sendmail", package="msmtp-mta")
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Smtp)
    server.messages = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = tmp_path / ".msmtprc"  # msmtp, as sendmail, reads $HOME/.msmtprc
    port = server.server_address[1]
    settings.write_text(f"account default\nhost 127.0.0.1\nport {port}\nfrom trainbox@localhost\nauth off\ntls off\n")
    settings.chmod(0o600)
    try:
        failures = deliver([str(EXAMPLES / "mail.sh"), "you@example.org"], GIVE_UP, {"HOME": str(tmp_path)})
    finally:
        server.shutdown()
        server.server_close()

    assert failures.seen == []
    (message,) = server.messages  # type: ignore[attr-defined]
    head, _, body = message.decode().partition("\r\n\r\n")
    assert "Subject: trainbox: give_up, attempt 3: reason restart budget spent" in head
    assert json.loads(body) == GIVE_UP


def test_desktop_calls_notify_send_with_a_critical_title_and_the_summary(tmp_path: Path) -> None:
    record = tmp_path / "argv.json"
    stand_in = tmp_path / "bin" / "notify-send"
    stand_in.parent.mkdir()
    stand_in.write_text(f"#!/bin/sh\npython3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" > {record}\n")
    stand_in.chmod(0o755)
    path = f"{stand_in.parent}{os.pathsep}{os.environ['PATH']}"
    failures = deliver([str(EXAMPLES / "desktop.sh")], GIVE_UP, {"PATH": path})

    assert failures.seen == []
    assert json.loads(record.read_text()) == [
        "--app-name=trainbox",
        "--urgency=critical",
        "trainbox: give_up",
        "give_up, attempt 3: reason restart budget spent",
    ]
