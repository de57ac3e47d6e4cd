//! Several `herald` processes on one Postgres database.
