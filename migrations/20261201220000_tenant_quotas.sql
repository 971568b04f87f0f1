-- migrate:up
-- Quotas of a tenant (adapter_name = '') or of one of its adapters, enforced by the
-- gateways (sent on tenant.events as TenantQuotaSet). 0 = unlimited. A tenant without a
-- row gets the gateway's default quota.
CREATE TABLE tenant_quotas (
    tenant_id     text NOT NULL REFERENCES tenants (tenant_id),
    adapter_name  text NOT NULL DEFAULT '',
    max_in_flight integer NOT NULL DEFAULT 0 CHECK (max_in_flight >= 0),
    tokens_per_s  double precision NOT NULL DEFAULT 0 CHECK (tokens_per_s >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, adapter_name)
);

-- migrate:down
DROP TABLE tenant_quotas;
