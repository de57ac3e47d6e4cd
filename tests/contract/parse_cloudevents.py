"""A receiver's reading of Herald's CloudEvents with the official SDK (`cloudevents`).

Reads a JSON file (argv[1]): a list of messages as they arrived, each with a `name`, its
`headers` (an object), its `body` (base64) and, when the endpoint signs `v1`, its `whsec`
secret. Each is parsed with `cloudevents.http.from_http` (binary or structured, as the SDK
tells from the headers; a NATS message's and a Redis entry's `ce-*` headers and fields are
the HTTP binding's), and its Standard Webhooks signature is checked over the bytes that
arrived with the official `standardwebhooks` library. Prints one JSON object: per name, the
attributes the SDK read, the data, and whether the signature verified (null without a
secret). A message the SDK refuses fails the script.
"""

import base64
import json
import sys

from cloudevents.http import from_http
from standardwebhooks import Webhook, WebhookVerificationError

SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def verified(secret, headers, body):
    if not secret:
        return None
    try:
        Webhook(secret).verify(body, {k: headers[k] for k in SIGNATURE_HEADERS}, json_parse=False)
        return True
    except WebhookVerificationError:
        return False


def main():
    with open(sys.argv[1]) as f:
        messages = json.load(f)
    out = {}
    for m in messages:
        body = base64.b64decode(m["body"])
        headers = {k.lower(): v for k, v in m["headers"].items()}
        event = from_http(headers, body)
        attributes = {k: str(v) for k, v in event.get_attributes().items()}
        data = event.get_data()
        if isinstance(data, (bytes, bytearray)):
            data = {"base64": base64.b64encode(data).decode()}
        out[m["name"]] = {
            "attributes": attributes,
            "data": data,
            "verified": verified(m.get("whsec"), headers, body),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
