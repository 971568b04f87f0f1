-- migrate:up
-- Cache manager: what a new leader needs to take over without mass evictions or
-- duplicate loads. Written only by the leader (Postgres advisory lock). Rows are
-- scoped by deployment (the manager's consumer group): several deployments (cells,
-- test runs) can share one database without reading each other's heat.
-- * cache_workers: workers seen recently and their WorkerInternal address, so a
--   new leader asks each one for its state (GetState) instead of waiting for the
--   next periodic snapshot;
-- * cache_version_stats: the heat statistics per version (decayed request count,
--   last access, error rate since load), flushed every few seconds.
CREATE TABLE cache_workers (
    deployment   text NOT NULL,
    worker_id    text NOT NULL,
    grpc_address text NOT NULL DEFAULT '',
    last_seen    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment, worker_id)
);

CREATE TABLE cache_version_stats (
    deployment          text NOT NULL,
    version_id          text NOT NULL,             -- 'tenant/name@version'
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
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment, version_id)
);

-- migrate:down
DROP TABLE cache_version_stats;
DROP TABLE cache_workers;
