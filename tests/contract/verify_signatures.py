"""A receiver's check of Herald's signatures with implementations that share no code with it.

Reads a JSON file (argv[1]) of deliveries as they arrived (id, timestamp, base64 body, the
`webhook-signature` header), the tenant's JWKS as served, and, per delivery, the `whsec_`
secret when the endpoint signs v1. Prints one JSON line: per delivery, the `kid`s of the
JWKS keys whose ed25519 signature verifies (`cryptography`, over `id.timestamp.body`), how
many `v1a` entries it had, whether the official Standard Webhooks library (`standardwebhooks`)
verifies it with the `whsec_` secret. That library's 1.1.0 (the latest) has no `v1a`: its
`verify` skips every entry that is not `v1`, so what it shows here is that a header with
`v1a` entries beside the `v1` one still verifies for a receiver that knows only v1.
"""

import base64
import json
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook, WebhookVerificationError


def b64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def ed25519_kids(keys, message, header):
    entries = [e[len("v1a,"):] for e in header.split(" ") if e.startswith("v1a,")]
    kids = []
    for key in keys:
        assert key["kty"] == "OKP" and key["crv"] == "Ed25519" and key["alg"] == "EdDSA", key
        public = Ed25519PublicKey.from_public_bytes(b64url(key["x"]))
        for entry in entries:
            try:
                public.verify(base64.b64decode(entry), message)
            except InvalidSignature:
                continue
            kids.append(key["kid"])
    return sorted(set(kids)), len(entries)


def library_verifies(secret, body, headers):
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
        return True
    except WebhookVerificationError:
        return False


def main():
    with open(sys.argv[1]) as f:
        case = json.load(f)
    keys = case["jwks"]["keys"]
    out = []
    for d in case["deliveries"]:
        body = base64.b64decode(d["body"])
        message = f"{d['id']}.{d['timestamp']}.".encode() + body
        kids, entries = ed25519_kids(keys, message, d["signature"])
        headers = {"webhook-id": d["id"], "webhook-timestamp": d["timestamp"], "webhook-signature": d["signature"]}
        v1 = library_verifies(d["whsec"], body, headers) if d.get("whsec") else None
        out.append({"id": d["id"], "endpoint": d["endpoint"], "kids": kids, "v1a_entries": entries,
                    "standardwebhooks_v1": v1})
    print(json.dumps({"results": out}))


main()
