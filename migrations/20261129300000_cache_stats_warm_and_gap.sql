-- migrate:up
-- The cache manager's heat statistics keep, across a restart, the WARM-tier decayed
-- request count (time constant score.warm_rate_window_s) and the smoothed gap between
-- requests (the HOT liveness discount), beside the HOT decayed count already saved.
ALTER TABLE cache_version_stats
    ADD COLUMN decayed_count_warm double precision NOT NULL DEFAULT 0,
    ADD COLUMN mean_gap_s         double precision NOT NULL DEFAULT 0;
-- Rows saved before: the HOT count is a lower bound of the WARM one (shorter memory).
UPDATE cache_version_stats SET decayed_count_warm = decayed_count;

-- migrate:down
ALTER TABLE cache_version_stats
    DROP COLUMN mean_gap_s,
    DROP COLUMN decayed_count_warm;
