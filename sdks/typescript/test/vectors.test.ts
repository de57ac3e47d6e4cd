// The signature vectors of sdks/vectors/signatures.json, through this SDK's `sign` and `Webhook`.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Webhook, WebhookVerificationError, sign } from "../src/index.js";
import { vectorsDir } from "./support.js";

interface SignVector { name: string; key: string; id: string; timestamp: number; body: string; signature: string }
interface VerifyVector {
  name: string; key: string; id: string; timestamp: string; body: string; signature: string; now: number; valid: boolean;
}
const vectors = JSON.parse(readFileSync(`${vectorsDir()}/signatures.json`, "utf8")) as {
  tolerance_seconds: number; sign: SignVector[]; verify: VerifyVector[];
};

test("every sign vector gives its signature", () => {
  assert.ok(vectors.sign.length > 0);
  for (const v of vectors.sign) {
    assert.equal(sign(v.key, v.id, v.timestamp, v.body), v.signature, v.name);
  }
});

test("every verify vector verifies or fails as it says", () => {
  assert.ok(vectors.verify.some((v) => v.valid) && vectors.verify.some((v) => !v.valid));
  for (const v of vectors.verify) {
    const headers = { "webhook-id": v.id, "webhook-timestamp": v.timestamp, "webhook-signature": v.signature };
    const check = () =>
      new Webhook(v.key).verify(Buffer.from(v.body, "utf8"), headers, { now: v.now, toleranceSeconds: vectors.tolerance_seconds });
    if (v.valid) {
      assert.doesNotThrow(check, v.name);
    } else {
      assert.throws(check, WebhookVerificationError, v.name);
    }
  }
});

test("a missing header and a bad key are verification errors", () => {
  const v = vectors.verify.find((x) => x.valid)!;
  const wh = new Webhook(v.key);
  assert.throws(() => wh.verify(v.body, { "webhook-id": v.id, "webhook-timestamp": v.timestamp }, { now: v.now }), /webhook-signature/);
  assert.throws(() => new Webhook("sk_live_nope"), WebhookVerificationError);
  assert.throws(() => new Webhook("whpk_AAAA"), /32 bytes/);
});
