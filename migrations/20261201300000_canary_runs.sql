-- migrate:up
-- The canary analysis' durable state (issue 16), written by the cache-manager leader only
-- (services/cache_manager/canary_runner.py), scoped by deployment like cache_version_stats:
-- the current stage of each running canary, when it started, whether an operator paused
-- it, and the last step taken (its id makes a step re-decided after a restart or a leader
-- change a no-op). The release pointers themselves stay the registry's.
CREATE TABLE canary_runs (
    deployment        text NOT NULL,
    adapter_id        text NOT NULL,
    version           text NOT NULL,
    percent           integer NOT NULL CHECK (percent BETWEEN 0 AND 100),
    stage_started_at  double precision NOT NULL,
    paused            boolean NOT NULL DEFAULT false,
    last_decision_id  text NOT NULL DEFAULT '',
    last_decision     jsonb NOT NULL DEFAULT '{}',
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment, adapter_id)
);

-- migrate:down
DROP TABLE canary_runs;
