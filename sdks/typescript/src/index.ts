// Herald's TypeScript SDK: the API client (generated, client.ts) and webhook verification (webhook.ts).

export * from "./client.js";
export * from "./webhook.js";
