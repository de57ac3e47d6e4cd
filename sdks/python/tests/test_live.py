"""Against a live node (HERALD_URL, HERALD_ADMIN_TOKEN; skipped without them): a tenant and an
endpoint whose receiver this test runs on 127.0.0.1, an event, its delivery read back, and the
request the receiver got verified with the SDK; then the API error vectors of
sdks/vectors/errors.json through the typed client.
"""

import json
import os
import queue
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from herald_sdk import OPERATIONS, HeraldClient, HeraldError, Webhook, WebhookVerificationError
from test_vectors import VECTORS, has_cryptography

BASE_URL = os.environ.get("HERALD_URL", "")
ADMIN_TOKEN = os.environ.get("HERALD_ADMIN_TOKEN", "")
LIVE = unittest.skipUnless(BASE_URL and ADMIN_TOKEN, "set HERALD_URL and HERALD_ADMIN_TOKEN to test against a node")


class Receiver:
    """A receiver on 127.0.0.1 that answers 200 and hands over each request it gets."""

    def __init__(self):
        arrived = self.arrived = queue.Queue()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
                arrived.put((self.headers, body))

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def next(self):
        try:
            return self.arrived.get(timeout=10)
        except queue.Empty:
            raise AssertionError("the receiver got no request within 10 s") from None

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def eventually(what, probe):
    """Polls `probe` every 50 ms until it gives a value, for at most 10 s."""
    deadline = time.monotonic() + 10
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within 10 s")
        time.sleep(0.05)


def new_tenant(admin: HeraldClient, kind: str) -> str:
    """A tenant of this run's own: a node's tenants outlive a test."""
    tenant_id = f"sdk-py-{kind}-{os.getpid()}-{time.time_ns()}"
    assert admin.create_tenant({"id": tenant_id, "name": "Python SDK test"})["id"] == tenant_id
    return tenant_id


def substitute(value, tenant):
    if isinstance(value, str):
        return value.replace("$tenant", tenant)
    if isinstance(value, list):
        return [substitute(v, tenant) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, tenant) for k, v in value.items()}
    return value


@LIVE
class LiveNode(unittest.TestCase):
    def test_an_event_goes_out_signed_and_the_sdk_verifies_what_arrived(self):
        admin = HeraldClient(BASE_URL, ADMIN_TOKEN)
        tenant = new_tenant(admin, "flow")
        rx = Receiver()
        self.addCleanup(rx.close)
        v1a = has_cryptography()
        endpoint = admin.create_endpoint(tenant, {"url": rx.url, "signatures": ["v1", "v1a"]})
        secret = endpoint["secret"]
        public_key = endpoint["public_keys"][0]["public_key"]
        accepted = admin.create_event(tenant, {"id": "evt_sdk_py", "type": "invoice.paid",
                                               "payload": {"amount": 1999, "currency": "EUR"}})
        self.assertEqual(accepted["id"], "evt_sdk_py")

        headers, body = rx.next()
        Webhook(secret).verify(body, headers)
        if v1a:
            Webhook(public_key).verify(body, headers)
        with self.assertRaises(WebhookVerificationError):
            Webhook(secret).verify(body + b" ", headers)
        self.assertEqual(headers["webhook-id"], "evt_sdk_py")
        envelope = json.loads(body)
        self.assertEqual((envelope["type"], envelope["data"]), ("invoice.paid", {"amount": 1999, "currency": "EUR"}))

        def delivered():
            page = admin.list_event_deliveries(tenant, "evt_sdk_py")
            return next((d for d in page["data"] if d["state"] == "delivered"), None)

        delivery = eventually("the delivery is delivered", delivered)
        self.assertEqual(delivery["endpoint_id"], endpoint["id"])
        detail = admin.get_delivery(tenant, delivery["id"])
        self.assertEqual([a["status"] for a in detail["attempt_history"]], [200])

    def test_every_api_error_vector_fails_with_its_status_and_code(self):
        vectors = json.loads((VECTORS / "errors.json").read_text())["errors"]
        admin = HeraldClient(BASE_URL, ADMIN_TOKEN)
        tenant = new_tenant(admin, "errors")
        read = admin.create_token(tenant, {"scopes": ["read"]})["token"]
        clients = {"admin": admin, "read": HeraldClient(BASE_URL, read),
                   "bogus": HeraldClient(BASE_URL, "hrld_not_a_token_herald_issued"), "none": HeraldClient(BASE_URL)}
        self.assertTrue(vectors)
        for v in vectors:
            with self.subTest(v["name"]):
                op = OPERATIONS[v["operation"]]
                args = [substitute(v["params"][p], tenant) for p in op["path_params"]]
                if op["body_type"]:
                    args.append(substitute(v.get("body"), tenant))
                method = getattr(clients[v["token"]], v["operation"])
                with self.assertRaises(HeraldError) as caught:
                    method(*args, **v.get("query", {}))
                e = caught.exception
                self.assertEqual((e.status, e.code), (v["status"], v["code"]), e.message)
                self.assertTrue(e.message.startswith(v.get("message_starts_with", "")), e.message)


if __name__ == "__main__":
    unittest.main()
