-- migrate:up
-- Tenants and their API keys. Keys are stored as SHA-256 hashes only; the
-- secret is shown once at creation and never again.
CREATE TYPE priority AS ENUM ('platinum', 'gold', 'silver', 'bronze');

CREATE TABLE tenants (
    tenant_id        text PRIMARY KEY CHECK (tenant_id ~ '^[a-z0-9][a-z0-9-]{1,62}$'),
    display_name     text NOT NULL DEFAULT '',
    default_priority priority NOT NULL DEFAULT 'silver',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    key_id      text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id),
    prefix      text NOT NULL UNIQUE,          -- first characters of the key, for display
    key_hash    text NOT NULL UNIQUE,          -- sha256 hex of the full secret
    description text NOT NULL DEFAULT '',
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

-- migrate:down
DROP TABLE api_keys;
DROP TABLE tenants;
DROP TYPE priority;
