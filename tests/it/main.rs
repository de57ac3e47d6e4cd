//! Herald's integration tests: one binary, real servers on 127.0.0.1, real SQLite files.

mod api;
mod cluster;
mod delivery;
mod durability;
mod edges;
mod plugins;
mod recovery;
mod secrets;
mod store;
