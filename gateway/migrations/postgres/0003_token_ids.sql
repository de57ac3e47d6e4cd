-- Tokens get a public id (listing, revocation) and a last-use time.
ALTER TABLE tokens ADD COLUMN id TEXT COLLATE "C", ADD COLUMN last_used_at BIGINT;
UPDATE tokens SET id = 'tok_' || left(hash, 16);
ALTER TABLE tokens ALTER COLUMN id SET NOT NULL;
CREATE UNIQUE INDEX tokens_id ON tokens (id);
CREATE INDEX tokens_tenant ON tokens (tenant_id, created_at);
