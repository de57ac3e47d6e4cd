-- Tokens get a public id (listing, revocation) and a last-use time.
ALTER TABLE tokens ADD COLUMN id TEXT;
ALTER TABLE tokens ADD COLUMN last_used_at INTEGER;
UPDATE tokens SET id = 'tok_' || substr(hash, 1, 16);
CREATE UNIQUE INDEX tokens_id ON tokens (id);
CREATE INDEX tokens_tenant ON tokens (tenant_id, created_at);
