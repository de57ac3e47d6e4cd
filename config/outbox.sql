-- Herald's transactional outbox: create it in the producer's own Postgres database (in the
-- schema its `[[outbox]]` source connects to), then insert one row per event in the same
-- transaction as the business change. Herald relays committed rows in `seq` order through
-- its durable, idempotent intake, then deletes them; a row it cannot ingest stays, parked
-- with `failed_at` and `error` set. `herald outbox schema --table NAME` prints this file
-- for another table name. Safe to run again (it changes nothing that exists).
CREATE TABLE IF NOT EXISTS herald_outbox (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Herald tenant (or a value the source's `tenant_map` maps); NULL: the source's `tenant`.
    tenant     TEXT,
    -- Herald's idempotency key per tenant (`webhook-id` at the receiver). Keep it stable:
    -- a row re-read after a crash is then a no-op.
    event_id   TEXT NOT NULL DEFAULT 'evt_' || md5(random()::text || clock_timestamp()::text),
    event_type TEXT NOT NULL,
    -- `json` keeps the bytes as written, and they reach the receiver unchanged (`jsonb`
    -- works too, normalised).
    payload    JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    -- Set by Herald, with the reason, when it parks a row it cannot ingest.
    failed_at  TIMESTAMPTZ,
    error      TEXT
);
-- Optional W3C trace context of the producer's transaction (`traceparent`, `tracestate`):
-- each delivery of the event sends the same trace id on. A malformed value is ignored.
-- A table without these columns keeps working.
ALTER TABLE herald_outbox ADD COLUMN IF NOT EXISTS traceparent TEXT;
ALTER TABLE herald_outbox ADD COLUMN IF NOT EXISTS tracestate TEXT;
CREATE INDEX IF NOT EXISTS herald_outbox_pending ON herald_outbox (seq) WHERE failed_at IS NULL;
CREATE INDEX IF NOT EXISTS herald_outbox_parked ON herald_outbox (failed_at) WHERE failed_at IS NOT NULL;

-- Wakes the relay when a transaction that inserted rows commits (a rolled-back one
-- notifies nothing); Herald also polls, so a lost notification only delays.
CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS herald_outbox_notify ON herald_outbox;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();
