//! Herald: a WebAssembly-extensible webhook delivery gateway.
//!
//! The pure policies (`schedule`, `pace`, `classify`, `sign`) take time and randomness as
//! arguments; the shells (`api`, `worker`, `deliver`, `store`) do the I/O; `app` wires them.

pub mod api;
pub mod app;
pub mod catalog;
pub mod classify;
pub mod cli;
pub mod clock;
pub mod config;
pub mod deliver;
pub mod intake;
pub mod json;
pub mod lease;
pub mod metrics;
pub mod model;
pub mod net;
pub mod ops;
pub mod outbox;
pub mod pace;
pub mod plugin;
pub mod replay;
pub mod scaffold;
pub mod schedule;
pub mod sign;
pub mod spec;
pub mod store;
pub mod telemetry;
pub mod worker;
