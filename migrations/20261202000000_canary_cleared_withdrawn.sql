-- migrate:up
-- Issue 16. canary_cleared: the canary may receive tenant traffic (the canary analysis
-- cleared it once its golden set passed, RegistryAdmin.ClearCanary; or the registry clears
-- canaries when set, LORAPLANE_REGISTRY_CANARY_CLEARANCE=false). Until then the gateways
-- send it golden-set requests only. Reset when the canary version changes. Pointers that
-- exist already keep serving their canary (true).
ALTER TABLE release_pointers ADD COLUMN canary_cleared boolean NOT NULL DEFAULT true;
-- withdrawn_reason: the canary analysis took a failing version out (withdrawn with no
-- version to fall back to, RegistryAdmin.WithdrawVersion, or rolled back from): the
-- gateways refuse its requests naming the withdrawal, no rollback returns to it, and a
-- cache-manager leader that takes over reads it here. Cleared when a person promotes it.
ALTER TABLE adapter_versions ADD COLUMN withdrawn_reason text NOT NULL DEFAULT '';

-- migrate:down
ALTER TABLE adapter_versions DROP COLUMN withdrawn_reason;
ALTER TABLE release_pointers DROP COLUMN canary_cleared;
