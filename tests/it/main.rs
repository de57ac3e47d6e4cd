//! Herald's integration tests: one binary, real servers on 127.0.0.1, real SQLite files.
//!
//! Where a new test goes: a behaviour seen through the HTTP API (status codes, validation,
//! auth) in `api`; what an attempt sent, as the API shows it, in `sent`; anything about sending to receivers (pacing, retries, 429, signatures) in
//! `delivery`; how soon a change to an endpoint applies in `changes`; dead letters, replays
//! and lease recovery in `recovery`; several nodes on one
//! Postgres in `cluster`; a killed process in `durability`; WebAssembly plugins end to end in
//! `plugins`; JavaScript plugins in `js`; `/metrics`, the dashboard and the alert rules in `metrics`; the transactional outbox relay in `outbox`; a `Store` method
//! in `store`'s conformance suite (it runs on both backends); a rule about the source tree
//! itself in `tidy`; the OpenAPI document, schemathesis and the generated client in
//! `contract`; the console in a real browser in `console`; the engine's timing rules (backoff, 429 pause, disable-after, linger) in
//! paused time in `timing`. Pure policies test themselves in their
//! own module, not here.

// Test code: a failed unwrap is a failed test, and tests compare against the wall clock.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod api;
mod changes;
mod cli;
mod cluster;
mod console;
mod contract;
mod delivery;
mod durability;
mod edges;
mod js;
mod limits;
mod metrics;
mod outbox;
mod plugin_config;
mod plugin_guard;
mod plugin_limits;
mod plugin_stats;
mod plugin_versions;
mod plugins;
mod props;
mod recovery;
mod scaffold;
mod secrets;
mod sent;
mod store;
mod tidy;
mod timing;
