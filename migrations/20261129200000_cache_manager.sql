-- migrate:up
-- Cache manager: what a new leader needs to take over without mass evictions or
-- duplicate loads. Written only by the leader (Postgres advisory lock).
-- * cache_workers: workers seen recently and their WorkerInternal address, so a
--   new leader asks each one for its state (GetState) instead of waiting for the
--   next periodic snapshot;
-- * cache_version_stats: the heat statistics per version (decayed request count,
--   last access, error rate since load), flushed every few seconds.
CREATE TABLE cache_workers (
    worker_id    text PRIMARY KEY,
    grpc_address text NOT NULL DEFAULT '',
    last_seen    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE cache_version_stats (
    version_id          text PRIMARY KEY,          -- 'tenant/name@version'
    decayed_count       double precision NOT NULL,
    as_of               double precision NOT NULL, -- epoch seconds
    last_access         double precision,          -- epoch seconds
    requests            bigint NOT NULL DEFAULT 0,
    interactive         bigint NOT NULL DEFAULT 0,
    background          bigint NOT NULL DEFAULT 0,
    canary              bigint NOT NULL DEFAULT 0,
    loads               bigint NOT NULL DEFAULT 0,
    requests_after_load bigint NOT NULL DEFAULT 0,
    errors_after_load   bigint NOT NULL DEFAULT 0,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- migrate:down
DROP TABLE cache_version_stats;
DROP TABLE cache_workers;
