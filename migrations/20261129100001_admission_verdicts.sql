-- migrate:up
-- Admission's memory of its decisions: one verdict per (adapter version, digest).
-- The serialized AdmissionEvent is kept verbatim so that a redelivered release
-- event republishes the very same verdict (same event_id) instead of deciding
-- again. Written before the verdict is published; the release offset is
-- committed only after the publish is acknowledged. Owned by the admission
-- service (no foreign key into the registry's tables: admission only knows
-- what the release event told it).
CREATE TABLE admission_verdicts (
    adapter_id        text NOT NULL,          -- '<tenant_id>/<name>'
    version           text NOT NULL,
    sha256            text NOT NULL,          -- manifest digest announced by the release
    release_event_id  uuid NOT NULL,          -- the AdapterReleased that was decided
    verdict_event_id  uuid NOT NULL UNIQUE,   -- meta.event_id of the stored verdict
    result            text NOT NULL CHECK (result IN ('admitted', 'rejected')),
    reasons           jsonb NOT NULL DEFAULT '[]'::jsonb,  -- [{code, message, path}]
    event             bytea NOT NULL,         -- serialized loraplane.v1.AdmissionEvent
    duration_ms       double precision NOT NULL DEFAULT 0,
    decided_by        text NOT NULL,          -- producer, e.g. 'admission/admission-0'
    decided_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (adapter_id, version, sha256)
);
CREATE INDEX admission_verdicts_decided_at_idx ON admission_verdicts (decided_at);
CREATE INDEX admission_verdicts_result_idx ON admission_verdicts (result, decided_at);

-- migrate:down
DROP TABLE admission_verdicts;
