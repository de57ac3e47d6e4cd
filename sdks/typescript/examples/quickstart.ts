// The whole loop on one machine: a receiver that verifies what it gets, then a tenant, an
// endpoint to that receiver and an event, through the typed client. Run against a node that
// allows private destinations (the receiver is on 127.0.0.1):
//
//   HERALD_URL=http://127.0.0.1:8080 HERALD_ADMIN_TOKEN=… node dist/examples/quickstart.js

import { once } from "node:events";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

import { HeraldClient, HeraldError, Webhook } from "../src/index.js";

const herald = new HeraldClient(process.env.HERALD_URL ?? "http://127.0.0.1:8080", process.env.HERALD_ADMIN_TOKEN);
const tenant = process.env.HERALD_TENANT ?? "acme";

// 1. The receiver, as your service runs it: verify the raw body first, then handle it.
let webhook: Webhook | undefined;
const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (chunk: Buffer) => chunks.push(chunk));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    try {
      webhook!.verify(body, req.headers);
    } catch (e) {
      console.error(`refused: ${String(e)}`);
      res.writeHead(401).end();
      return;
    }
    res.writeHead(204).end();
    console.log(`verified ${String(req.headers["webhook-id"])}: ${body.toString("utf8")}`);
    server.close();
  });
});
server.listen(0, "127.0.0.1");
await once(server, "listening");
const { port } = server.address() as AddressInfo;

// 2. A tenant (kept if it exists), an endpoint to the receiver, and an event.
try {
  await herald.createTenant({ id: tenant });
} catch (e) {
  if (!(e instanceof HeraldError && e.code === "conflict")) throw e;
}
const endpoint = await herald.createEndpoint(tenant, { url: `http://127.0.0.1:${port}/hook`, event_types: ["invoice.*"] });
webhook = new Webhook(endpoint.secret!);
const accepted = await herald.createEvent(tenant, { type: "invoice.paid", payload: { amount: 1999, currency: "EUR" } });
console.log(`accepted ${accepted.id}`);
setTimeout(() => {
  console.error("nothing arrived within 30 s");
  process.exit(1);
}, 30_000).unref();
