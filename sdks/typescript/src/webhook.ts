// Hand-written: verifies (and signs) Standard Webhooks signatures as Herald sends them.
// `v1`: HMAC-SHA256 with the endpoint's `whsec_` secret; `v1a`: ed25519, checked with the
// endpoint's `whpk_` public key. Both sign `{webhook-id}.{webhook-timestamp}.{body}`.

import { createHmac, createPrivateKey, createPublicKey, sign as edSign, timingSafeEqual, verify as edVerify } from "node:crypto";
import type { KeyObject } from "node:crypto";

/** How far `webhook-timestamp` may be from now, in seconds, before a request is refused. */
export const TOLERANCE_SECONDS = 300;

/** A request that does not carry a valid signature of the key, or is too old or too new. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

/** The request's headers: a `Headers` (fetch) or a plain object (Node's `req.headers`). */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

export interface VerifyOptions {
  /** The time to check the timestamp against, in unix seconds (default: now). */
  now?: number;
  /** Default `TOLERANCE_SECONDS`. */
  toleranceSeconds?: number;
}

/** Verifies requests with one key: a `whsec_` secret (v1) or a `whpk_` public key (v1a). */
export class Webhook {
  readonly #check: (message: Buffer, entries: string[]) => boolean;

  constructor(key: string) {
    if (key.startsWith("whsec_")) {
      const secret = keyBytes(key, "whsec_");
      this.#check = (message, entries) => {
        const expected = createHmac("sha256", secret).update(message).digest();
        return entriesOf(entries, "v1").some((tag) => tag.length === expected.length && timingSafeEqual(tag, expected));
      };
    } else if (key.startsWith("whpk_")) {
      const publicKey = ed25519PublicKey(keyBytes(key, "whpk_"));
      this.#check = (message, entries) =>
        entriesOf(entries, "v1a").some((sig) => sig.length === 64 && edVerify(null, message, publicKey, sig));
    } else {
      throw new WebhookVerificationError('the key must start with "whsec_" (v1) or "whpk_" (v1a)');
    }
  }

  /** Throws `WebhookVerificationError` unless the request is signed with this key, within the tolerance. */
  verify(body: string | Uint8Array, headers: WebhookHeaders, options: VerifyOptions = {}): void {
    const id = header(headers, "webhook-id");
    const timestamp = header(headers, "webhook-timestamp");
    const signature = header(headers, "webhook-signature");
    if (!/^-?[0-9]+$/.test(timestamp)) {
      throw new WebhookVerificationError("webhook-timestamp is not an integer");
    }
    const now = options.now ?? Math.floor(Date.now() / 1000);
    const tolerance = options.toleranceSeconds ?? TOLERANCE_SECONDS;
    if (Math.abs(now - Number(timestamp)) > tolerance) {
      throw new WebhookVerificationError("webhook-timestamp is too far from now");
    }
    if (!this.#check(signedContent(id, timestamp, body), signature.split(" ").filter((e) => e !== ""))) {
      throw new WebhookVerificationError("no signature of this key matches");
    }
  }
}

/** The `webhook-signature` entry of `key` (a `whsec_` secret or a `whsk_` signing key). */
export function sign(key: string, id: string, timestamp: number, body: string | Uint8Array): string {
  const message = signedContent(id, String(timestamp), body);
  if (key.startsWith("whsec_")) {
    return "v1," + createHmac("sha256", keyBytes(key, "whsec_")).update(message).digest("base64");
  }
  if (key.startsWith("whsk_")) {
    const bytes = keyBytes(key, "whsk_");
    if (bytes.length !== 32 && bytes.length !== 64) {
      throw new WebhookVerificationError("a whsk_ key is 32 bytes (the seed) or 64 (seed, then public key)");
    }
    const pkcs8 = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), bytes.subarray(0, 32)]);
    const privateKey = createPrivateKey({ key: pkcs8, format: "der", type: "pkcs8" });
    return "v1a," + edSign(null, message, privateKey).toString("base64");
  }
  throw new WebhookVerificationError('the key must start with "whsec_" (v1) or "whsk_" (v1a)');
}

function signedContent(id: string, timestamp: string, body: string | Uint8Array): Buffer {
  const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body);
  return Buffer.concat([Buffer.from(`${id}.${timestamp}.`, "utf8"), bytes]);
}

function keyBytes(key: string, prefix: string): Buffer {
  const text = key.slice(prefix.length);
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(text)) {
    throw new WebhookVerificationError(`the ${prefix} key is not base64`);
  }
  return Buffer.from(text, "base64");
}

function ed25519PublicKey(bytes: Buffer): KeyObject {
  if (bytes.length !== 32) {
    throw new WebhookVerificationError("a whpk_ key is 32 bytes");
  }
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: bytes.toString("base64url") }, format: "jwk" });
}

/** The decoded signatures of the `version` entries; malformed ones are left out. */
function entriesOf(entries: string[], version: string): Buffer[] {
  return entries
    .filter((e) => e.startsWith(version + ","))
    .map((e) => e.slice(version.length + 1))
    .filter((b64) => /^[A-Za-z0-9+/]+={0,2}$/.test(b64))
    .map((b64) => Buffer.from(b64, "base64"));
}

function header(headers: WebhookHeaders, name: string): string {
  const value =
    headers instanceof Headers
      ? headers.get(name)
      : Object.entries(headers).find(([key]) => key.toLowerCase() === name)?.[1];
  const text = Array.isArray(value) ? value[0] : value;
  if (text === undefined || text === null) {
    throw new WebhookVerificationError(`the ${name} header is missing`);
  }
  return text;
}
