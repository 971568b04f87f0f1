-- migrate:up
-- Registry additions:
-- * adapter_versions.files / lora_alpha: the full record (file list with sizes and
--   digests, LoRA alpha) carried by AdapterReleased;
-- * release_pointers.stable_history: earlier stable versions, oldest first, so a
--   rollback without an explicit target can return to the previous stable version;
-- * outbox.tenant_id / base_model: labels of the outbox lag metrics.
ALTER TABLE adapter_versions
    ADD COLUMN files      jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN lora_alpha real  NOT NULL DEFAULT 0;
CREATE INDEX adapter_versions_adapter_idx ON adapter_versions (adapter_id, engine_id);

ALTER TABLE release_pointers
    ADD COLUMN stable_history text[] NOT NULL DEFAULT '{}';

ALTER TABLE outbox
    ADD COLUMN tenant_id  text NOT NULL DEFAULT '',
    ADD COLUMN base_model text NOT NULL DEFAULT '';

-- migrate:down
ALTER TABLE outbox DROP COLUMN base_model, DROP COLUMN tenant_id;
ALTER TABLE release_pointers DROP COLUMN stable_history;
DROP INDEX adapter_versions_adapter_idx;
ALTER TABLE adapter_versions DROP COLUMN lora_alpha, DROP COLUMN files;
