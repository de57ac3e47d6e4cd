//! Herald's integration tests: one binary, real servers on 127.0.0.1, real SQLite files
//! and Postgres schemas. The harness (`tests/src/lib.rs`) holds `TestGateway`,
//! `HeraldProcess`, `FakeReceiver`, `Api`, `backends!` (one case, both stores) and
//! `eventually` (the one poll). Pure policies test themselves in their own module.
//!
//! Where a new test goes, one line per module:
//!
//! - `apply`: `herald apply` and `herald dump`: the round trip to a fresh node, dry runs, prune, secret references, bad documents
//! - `api`: the HTTP API: round trips, idempotency, fan-out, bad input, tenant isolation
//! - `audit`: the audit log: every write route of `/openapi.json` leaves one entry, a refused one none; listings
//! - `batching`: several events per request: full and partial batches, one signature, all-or-nothing retries, partial acceptance, dead letters, ordering keys, refusals
//! - `catalog`: the event catalog: types and schema versions, `schema_validation` at intake, test sends, the export
//! - `changes`: how soon a change to an endpoint applies to its partition (within a second)
//! - `cloudevents`: CloudEvents output per endpoint: HTTP modes read by the official SDK, the brokers' bindings, refusals
//! - `cluster`: several `herald` processes on one Postgres: no double sends, the pace across nodes
//! - `console`: the console in headless Chromium: pages, scopes, XSS safety, screenshots
//! - `console_endpoints`: endpoints added, edited and deleted in the console and the portal (Chromium), `/`, `herald-ops` unlisted
//! - `contract`: the OpenAPI document against the router, schemathesis, the generated client
//! - `db_restart`: Herald's Postgres (a server of the test's own) restarting under running nodes
//! - `delivery`: sending to receivers: retries, 429 pauses, the classification table, signatures
//! - `delivery_status`: an endpoint's `delivery_status` (throttled, failing, paused, active) against real receivers
//! - `destinations`: queue destinations (Redis Streams, NATS JetStream, AMQP) against real brokers; `destinations/batch`: batching endpoints' pipelined rounds
//! - `durability`: a killed or stopped `herald` process: nothing acknowledged is lost, restarts resume
//! - `endpoint_auth`: how requests authenticate and leave: OAuth2 against a local token server
//! - `edges`: the listener: slow and idle clients, the connection cap
//! - `filters`: content filters on endpoints: fan-out, refusals, replays, the test-filter routes
//! - `listen`: `herald listen` with real processes: a thousand signed deliveries, a killed listener, answers classified as HTTP, two nodes, bad input
//! - `limits`: refusals: the error shape, size limits, durations, deep payloads
//! - `mcp`: `herald mcp`, the Model Context Protocol server on stdio, driven over its pipes against a node
//! - `metrics`: `/metrics` under real deliveries, promtool, the dashboard and alert rules
//! - `ordering`: ordered endpoints: each key in intake order through failures, dead letters, a SIGKILL
//! - `outbox`: the transactional outbox relay from a producer's Postgres
//! - `portal`: the customer portal's API: minted links, sessions, limits, branding
//! - `portal_browser`: the customer portal in headless Chromium: the link, the pages, framing
//! - `portal_reach`: a portal session limited to one endpoint, walked over every route of `/openapi.json`
//! - `packaging`: the image, the Helm chart, the compose stack and the Debian package, used as shipped
//! - `poll`: pull delivery: pages, signatures, acknowledgements, cursors, the `poll` scope, never pushed
//! - `plugins`: plugins end to end: hooks, uploads, isolation, hot reload; under it `config`,
//!   `guard`, `js` (JavaScript plugins), `limits`, `stats`, `versions`
//! - `props`: property tests of the validators through the real API
//! - `quickstart`: README's five-minute path, run as written
//! - `recovery`: dead letters, replays, operational events, retention
//! - `scaffold`: `herald plugin new` projects build and their tests pass
//! - `sdks`: the SDKs of `sdks/`: generated from the served document, the conformance vectors, each SDK's tests against a live node
//! - `secrets`: tokens and secrets: listing, revocation, never printed
//! - `sent`: what each attempt sent, as the API shows it
//! - `store`: the `Store` conformance suite, on both backends; `schemas`: both migrated schemas compared
//! - `tidy`: the source tree's rules: I/O library owners, layers, routes; the docs' links
//! - `timing`: the engine's timing rules in paused time (backoff, 429, disable-after, linger)
//! - `tracing`: W3C trace context from producer to receiver, and the spans exported over OTLP
//! - `verification`: verified endpoints: the signed handshake before deliveries, waiting, verify now, URL changes
//! - `versions`: pinned payload versions: events' schema versions, adapter plugins (chained) to an endpoint's pin, the hold for a missing adapter, the export

// Test code: a failed unwrap is a failed test, and tests compare against the wall clock.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod api;
mod apply;
mod audit;
mod batching;
mod catalog;
mod changes;
mod cli;
mod cloudevents;
mod cluster;
mod console;
mod console_endpoints;
mod contract;
mod db_restart;
mod delivery;
mod delivery_status;
mod destinations;
mod durability;
mod edges;
mod endpoint_auth;
mod filters;
mod limits;
mod listen;
mod mcp;
mod metrics;
mod ordering;
mod outbox;
mod packaging;
mod plugins;
mod poll;
mod portal;
mod portal_browser;
mod portal_reach;
mod props;
mod quickstart;
mod recovery;
mod scaffold;
mod sdks;
mod secrets;
mod sent;
mod signatures;
mod store;
mod tidy;
mod timing;
mod tracing;
mod verification;
mod versions;
