"""A webhook receiver to watch Herald deliver: every POST (any path) is answered 200,
logged as one JSON line on stdout, and kept (the last 1,000); GET / lists them as JSON,
oldest first. Standard library only."""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

received = []
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        entry = {
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode("utf-8", "replace"),
        }
        with lock:
            received.append(entry)
            del received[:-1000]
        print(json.dumps({"webhook-id": entry["headers"].get("webhook-id"), "path": self.path,
                          "body": entry["body"][:500]}), flush=True)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        with lock:
            data = json.dumps(received).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    print("receiver listening on :9999", file=sys.stderr, flush=True)
    ThreadingHTTPServer(("0.0.0.0", 9999), Handler).serve_forever()
