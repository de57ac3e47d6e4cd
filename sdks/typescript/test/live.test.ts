// Against a live node (HERALD_URL, HERALD_ADMIN_TOKEN; skipped without them): a tenant and an
// endpoint whose receiver this test runs on 127.0.0.1, an event, its delivery read back, and
// the request the receiver got verified with the SDK; then the API error vectors of
// sdks/vectors/errors.json through the typed client.

import assert from "node:assert/strict";
import { once } from "node:events";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { HeraldClient, HeraldError, OPERATIONS, Webhook, WebhookVerificationError } from "../src/index.js";
import { vectorsDir } from "./support.js";

const baseUrl = process.env.HERALD_URL ?? "";
const adminToken = process.env.HERALD_ADMIN_TOKEN ?? "";
const live = baseUrl && adminToken ? {} : { skip: "set HERALD_URL and HERALD_ADMIN_TOKEN to test against a node" };

interface Received {
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** A receiver on 127.0.0.1 that answers 200 and hands over each request it gets. */
async function receiver() {
  const arrived: Received[] = [];
  const waiting: Array<(r: Received) => void> = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      res.end();
      const got = { headers: req.headers, body: Buffer.concat(chunks) };
      const next = waiting.shift();
      if (next) next(got);
      else arrived.push(got);
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as AddressInfo;
  const next = () =>
    within(10_000, "the receiver got no request", arrived.length > 0 ? Promise.resolve(arrived.shift()!) : new Promise<Received>((r) => waiting.push(r)));
  return { url: `http://127.0.0.1:${port}/hook`, next, close: () => server.close() };
}

async function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Polls `probe` every 50 ms until it gives a value, for at most 10 s. */
async function eventually<T>(what: string, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`${what}: not within 10 s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A tenant of this run's own: a node's tenants outlive a test. */
async function newTenant(admin: HeraldClient, kind: string): Promise<string> {
  const id = `sdk-ts-${kind}-${process.pid}-${Date.now()}`;
  const tenant = await admin.createTenant({ id, name: "TypeScript SDK test" });
  assert.equal(tenant.id, id);
  return id;
}

test("an event goes out signed, its delivery reads back, and the SDK verifies what arrived", live, async () => {
  const admin = new HeraldClient(baseUrl, adminToken);
  const tenant = await newTenant(admin, "flow");
  const rx = await receiver();
  try {
    const endpoint = await admin.createEndpoint(tenant, { url: rx.url, signatures: ["v1", "v1a"] });
    const secret = endpoint.secret ?? assert.fail("a v1 endpoint shows its secret once");
    const publicKey = endpoint.public_keys?.[0]?.public_key ?? assert.fail("a v1a endpoint shows its public key");
    const accepted = await admin.createEvent(tenant, { id: "evt_sdk_ts", type: "invoice.paid", payload: { amount: 1999, currency: "EUR" } });
    assert.equal(accepted.id, "evt_sdk_ts");

    const got = await rx.next();
    new Webhook(secret).verify(got.body, got.headers);
    new Webhook(publicKey).verify(got.body, got.headers);
    assert.throws(() => new Webhook(secret).verify(Buffer.concat([got.body, Buffer.from(" ")]), got.headers), WebhookVerificationError);
    assert.equal(got.headers["webhook-id"], "evt_sdk_ts");
    const envelope = JSON.parse(got.body.toString("utf8")) as { type: string; data: unknown };
    assert.equal(envelope.type, "invoice.paid");
    assert.deepEqual(envelope.data, { amount: 1999, currency: "EUR" });

    const delivery = await eventually("the delivery is delivered", async () => {
      const page = await admin.listEventDeliveries(tenant, "evt_sdk_ts");
      return page.data.find((d) => d.state === "delivered");
    });
    assert.equal(delivery.endpoint_id, endpoint.id);
    const detail = await admin.getDelivery(tenant, delivery.id);
    assert.equal(detail.attempt_history.length, 1);
    assert.equal(detail.attempt_history[0]!.status, 200);
  } finally {
    rx.close();
  }
});

interface ErrorVector {
  name: string;
  operation: string;
  params?: Record<string, string>;
  query?: Record<string, unknown>;
  body?: unknown;
  token: "admin" | "read" | "bogus" | "none";
  status: number;
  code: string;
  message_starts_with?: string;
}

const camel = (id: string) => id.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

function substitute(value: unknown, tenant: string): unknown {
  if (typeof value === "string") return value.replaceAll("$tenant", tenant);
  if (Array.isArray(value)) return value.map((v) => substitute(v, tenant));
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, tenant)]));
  }
  return value;
}

test("every API error vector fails with its status and code", live, async () => {
  const vectors = JSON.parse(readFileSync(`${vectorsDir()}/errors.json`, "utf8")) as { errors: ErrorVector[] };
  const admin = new HeraldClient(baseUrl, adminToken);
  const tenant = await newTenant(admin, "errors");
  const read = await admin.createToken(tenant, { scopes: ["read"] });
  const clients = {
    admin,
    read: new HeraldClient(baseUrl, read.token),
    bogus: new HeraldClient(baseUrl, "hrld_not_a_token_herald_issued"),
    none: new HeraldClient(baseUrl),
  };
  assert.ok(vectors.errors.length > 0);
  for (const v of vectors.errors) {
    const name = camel(v.operation) as keyof typeof OPERATIONS;
    const op = OPERATIONS[name] ?? assert.fail(`${v.name}: no operation ${v.operation}`);
    const args: unknown[] = op.pathParams.map((p: string) => substitute(v.params?.[p], tenant));
    if (op.bodyType) args.push(substitute(v.body, tenant));
    if (op.query.length > 0) args.push(v.query);
    const method = (clients[v.token] as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>)[name]!;
    await assert.rejects(method.apply(clients[v.token], args), (e: unknown) => {
      assert.ok(e instanceof HeraldError, `${v.name}: ${String(e)}`);
      assert.equal(e.status, v.status, `${v.name}: ${e.message}`);
      assert.equal(e.code, v.code, `${v.name}: ${e.message}`);
      assert.ok(e.message.startsWith(v.message_starts_with ?? ""), `${v.name}: ${e.message}`);
      return true;
    });
  }
});
