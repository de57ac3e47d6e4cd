"""The signature vectors of sdks/vectors/signatures.json, through this SDK's `sign` and `Webhook`.

The `v1a` vectors need `cryptography` (as `Webhook` does for `whpk_` keys): with
HERALD_SDK_REQUIRE_V1A=1 (Herald's own test run) a missing package fails them; else they
are counted as skipped and the `v1` vectors still run.
"""

import json
import os
import unittest
from pathlib import Path

from herald_sdk import Webhook, WebhookVerificationError, sign

VECTORS = Path(os.environ.get("HERALD_SDK_VECTORS", Path(__file__).resolve().parents[2] / "vectors"))


def has_cryptography() -> bool:
    try:
        import cryptography  # noqa: F401
        return True
    except ImportError:
        if os.environ.get("HERALD_SDK_REQUIRE_V1A") == "1":
            raise
        return False


def is_v1a(key: str) -> bool:
    return key.startswith(("whsk_", "whpk_"))


class SignatureVectors(unittest.TestCase):
    vectors = json.loads((VECTORS / "signatures.json").read_text())

    def test_every_sign_vector_gives_its_signature(self):
        v1a = has_cryptography()
        for v in self.vectors["sign"]:
            if is_v1a(v["key"]) and not v1a:
                continue
            with self.subTest(v["name"]):
                self.assertEqual(sign(v["key"], v["id"], v["timestamp"], v["body"].encode()), v["signature"])

    def test_every_verify_vector_verifies_or_fails_as_it_says(self):
        v1a = has_cryptography()
        tolerance = self.vectors["tolerance_seconds"]
        checked = 0
        for v in self.vectors["verify"]:
            if is_v1a(v["key"]) and not v1a:
                continue
            headers = {"webhook-id": v["id"], "webhook-timestamp": v["timestamp"], "webhook-signature": v["signature"]}
            with self.subTest(v["name"]):
                check = lambda: Webhook(v["key"]).verify(v["body"].encode(), headers, now=v["now"],  # noqa: E731
                                                         tolerance_seconds=tolerance)
                if v["valid"]:
                    check()
                else:
                    self.assertRaises(WebhookVerificationError, check)
                checked += 1
        self.assertGreater(checked, 10)

    def test_a_missing_header_and_a_bad_key_are_verification_errors(self):
        v = next(x for x in self.vectors["verify"] if x["valid"] and x["key"].startswith("whsec_"))
        headers = {"Webhook-Id": v["id"], "Webhook-Timestamp": v["timestamp"]}
        with self.assertRaisesRegex(WebhookVerificationError, "webhook-signature"):
            Webhook(v["key"]).verify(v["body"], headers, now=v["now"])
        with self.assertRaises(WebhookVerificationError):
            Webhook("sk_live_nope")


if __name__ == "__main__":
    unittest.main()
