"""The whole loop on one machine: a receiver that verifies what it gets, then a tenant, an
endpoint to that receiver and an event, through the typed client. Run against a node that
allows private destinations (the receiver is on 127.0.0.1):

    HERALD_URL=http://127.0.0.1:8080 HERALD_ADMIN_TOKEN=… PYTHONPATH=sdks/python python3 sdks/python/examples/quickstart.py
"""

import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from herald_sdk import HeraldClient, HeraldError, Webhook, WebhookVerificationError

herald = HeraldClient(os.environ.get("HERALD_URL", "http://127.0.0.1:8080"), os.environ.get("HERALD_ADMIN_TOKEN"))
tenant = os.environ.get("HERALD_TENANT", "acme")
webhook = None


class Receiver(BaseHTTPRequestHandler):
    """The receiver, as your service runs it: verify the raw body first, then handle it."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        try:
            webhook.verify(body, self.headers)
        except WebhookVerificationError as e:
            print(f"refused: {e}")
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(204)
        self.end_headers()
        print(f"verified {self.headers['webhook-id']}: {body.decode()}", flush=True)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Receiver)
server.timeout = 30
handled = threading.Thread(target=server.handle_request)
handled.start()

try:
    herald.create_tenant({"id": tenant})
except HeraldError as e:
    if e.code != "conflict":
        raise
endpoint = herald.create_endpoint(tenant, {"url": f"http://127.0.0.1:{server.server_address[1]}/hook",
                                           "event_types": ["invoice.*"]})
webhook = Webhook(endpoint["secret"])
accepted = herald.create_event(tenant, {"type": "invoice.paid", "payload": {"amount": 1999, "currency": "EUR"}})
print(f"accepted {accepted['id']}", flush=True)
handled.join()
server.server_close()
