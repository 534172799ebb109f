"""A stand-in for EC2's instance metadata service inside a lab host (tests cannot reach EC2):
the IMDSv2 session token, and `spot/instance-action`, which answers 404 until a notice is
written to a file, as EC2 answers until it schedules the instance's reclaim.

It listens on 169.254.169.254:80 inside the host's network namespace (the address added to
the host's loopback), so the watcher on the node asks the real address. Behaviour follows
AWS's documentation of IMDSv2: PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds
gives a token; a GET without a valid X-aws-ec2-metadata-token is refused with 401.

    python tests/ssh/imds.py NOTICE_FILE LOG_FILE
"""

from __future__ import annotations

import http.server
import secrets
import subprocess
import sys
import time
from pathlib import Path

ADDRESS = "169.254.169.254"


class Handler(http.server.BaseHTTPRequestHandler):
    token = secrets.token_hex(16)
    notice: Path
    log: Path

    def _record(self, code: int) -> None:
        with open(self.log, "a") as out:
            out.write(f"{self.command} {self.path} {code}\n")

    def _answer(self, code: int, body: str = "") -> None:
        self._record(code)
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/latest/api/token" and \
                self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._answer(200, self.token)
        else:
            self._answer(400)

    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get("X-aws-ec2-metadata-token") != self.token:
            self._answer(401)
        elif self.path == "/latest/meta-data/spot/instance-action" and self.notice.exists():
            self._answer(200, self.notice.read_text())
        else:
            self._answer(404)

    def log_message(self, *args) -> None:
        pass


def start_in(netns: str, notice: Path, log: Path) -> subprocess.Popen:
    """The stand-in in a lab host's namespace, once it answers."""
    subprocess.run(["ip", "netns", "exec", netns, "ip", "addr", "add", f"{ADDRESS}/32", "dev",
                    "lo"], check=True)
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, __file__,
                             str(notice), str(log)], start_new_session=True)
    deadline = time.monotonic() + 20
    while not log.exists() or "ready" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the IMDS stand-in in {netns} did not start")
        time.sleep(0.1)
    return proc


def main() -> None:
    Handler.notice, Handler.log = Path(sys.argv[1]), Path(sys.argv[2])
    server = http.server.HTTPServer((ADDRESS, 80), Handler)
    with open(Handler.log, "a") as out:
        out.write("ready\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
