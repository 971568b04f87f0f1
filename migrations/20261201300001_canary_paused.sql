-- migrate:up
-- An operator paused the canary analysis of this adapter's canary (loraplane canary pause,
-- RegistryAdmin.PauseCanary, issue 16): the cache manager's analysis reads it and takes no
-- advance or promote step (failure rules still abort). Reset when the canary changes.
ALTER TABLE release_pointers ADD COLUMN canary_paused boolean NOT NULL DEFAULT false;

-- migrate:down
ALTER TABLE release_pointers DROP COLUMN canary_paused;
