"""A stand-in for `python -m sglang.launch_server`, for the launcher's and the demo's CPU tests.

    python fake_server.py --port P [--healthy-after S] [--exit-at-start N] [--ignore-term] [--child]

Answers GET /health 503 until S seconds after start, then 200; POST /generate {"text": " Paris."};
anything else 404 with a body. --child starts a child process in its group (a scheduler stand-in)
that the server ends on SIGTERM; --ignore-term makes both survive SIGTERM (only SIGKILL ends
them); --exit-at-start N exits with code N before listening.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--healthy-after", type=float, default=0.0)
    ap.add_argument("--exit-at-start", type=int)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    print(f"fake server starting on {a.port}; FAKE_GREETING={os.environ.get('FAKE_GREETING')} "
          f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')}", flush=True)
    if a.exit_at_start is not None:
        print("fake server: refusing to start", flush=True)
        sys.exit(a.exit_at_start)
    t0 = time.time()
    child = None
    if a.child:
        code = "import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if a.ignore_term else "") + \
               "time.sleep(600)"
        child = subprocess.Popen([sys.executable, "-c", code])

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                ok = time.time() - t0 >= a.healthy_after
                self._send(200 if ok else 503, {"ok": ok})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/generate":
                self._send(200, {"text": " Paris."})
            elif self.path == "/flush_cache":  # sglang answers in plain text
                data = b"Cache flushed.\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)

    def on_term(signum, frame):
        if a.ignore_term:
            return
        if child is not None:
            child.terminate()
            child.wait()
        print("fake server: clean shutdown", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    print("fake server listening", flush=True)
    server.serve_forever()


def launcher_server(**fields):
    """A sglang.sm120.launcher.Server that starts this script in place of sglang.launch_server
    (its args are this script's flags)."""
    from sglang.sm120 import launcher

    class FakeServer(launcher.Server):
        def command(self):
            return [sys.executable, __file__, "--port", str(self.port), *self.args]

    return FakeServer(**fields)


if __name__ == "__main__":
    main()
