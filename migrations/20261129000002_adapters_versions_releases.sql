-- migrate:up
-- Adapters (a tenant's named adapter), their immutable versions and the
-- release pointers (stable, canary + percent, rollback target).
CREATE TYPE version_status AS ENUM ('pending', 'admitted', 'rejected', 'active', 'canary', 'retired');

-- Engine-facing integer ids for adapter versions (vLLM lora_int_id): stable,
-- positive, never derived from hashing.
CREATE SEQUENCE adapter_version_engine_id_seq START 1;

CREATE TABLE adapters (
    adapter_id        text PRIMARY KEY,                 -- '<tenant_id>/<name>'
    tenant_id         text NOT NULL REFERENCES tenants (tenant_id),
    name              text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    base_model        text NOT NULL,
    priority_override priority,                         -- NULL: the tenant's default
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name),
    CHECK (adapter_id = tenant_id || '/' || name)
);

CREATE TABLE adapter_versions (
    adapter_id         text NOT NULL REFERENCES adapters (adapter_id),
    version            text NOT NULL CHECK (version ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    engine_id          bigint NOT NULL UNIQUE DEFAULT nextval('adapter_version_engine_id_seq'),
    base_model         text NOT NULL,
    rank               integer NOT NULL CHECK (rank > 0),
    format             text NOT NULL DEFAULT 'peft',
    target_modules     text[] NOT NULL,
    artifact_uri       text NOT NULL,
    sha256             text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes         bigint NOT NULL CHECK (size_bytes >= 0),
    signature_uri      text NOT NULL DEFAULT '',
    signature_bundle   bytea,
    signer_identity    text NOT NULL DEFAULT '',
    tokenizer_revision text NOT NULL DEFAULT '',
    max_rank_supported integer,
    status             version_status NOT NULL DEFAULT 'pending',
    priority_override  priority,
    reasons            jsonb NOT NULL DEFAULT '[]'::jsonb,
    created_by         text NOT NULL DEFAULT '',
    created_at         timestamptz NOT NULL DEFAULT now(),
    admitted_at        timestamptz,
    retired_at         timestamptz,
    PRIMARY KEY (adapter_id, version)
);
CREATE INDEX adapter_versions_status_idx ON adapter_versions (status);
CREATE INDEX adapter_versions_base_model_idx ON adapter_versions (base_model);

CREATE TABLE release_pointers (
    adapter_id     text PRIMARY KEY REFERENCES adapters (adapter_id),
    stable_version text,
    canary_version text,
    canary_percent integer NOT NULL DEFAULT 0 CHECK (canary_percent BETWEEN 0 AND 100),
    rollback_to    text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (adapter_id, stable_version) REFERENCES adapter_versions (adapter_id, version),
    FOREIGN KEY (adapter_id, canary_version) REFERENCES adapter_versions (adapter_id, version),
    FOREIGN KEY (adapter_id, rollback_to) REFERENCES adapter_versions (adapter_id, version)
);

-- Adapters a tenant may use besides its own.
CREATE TABLE adapter_shares (
    adapter_id text NOT NULL REFERENCES adapters (adapter_id),
    tenant_id  text NOT NULL REFERENCES tenants (tenant_id),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (adapter_id, tenant_id)
);

-- migrate:down
DROP TABLE adapter_shares;
DROP TABLE release_pointers;
DROP TABLE adapter_versions;
DROP TABLE adapters;
DROP SEQUENCE adapter_version_engine_id_seq;
DROP TYPE version_status;
