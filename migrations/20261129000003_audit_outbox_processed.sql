-- migrate:up
-- Audit log of every state change, the transactional outbox the relay
-- publishes to Kafka, and the event ids each consumer already applied.
CREATE TABLE audit_log (
    id         bigserial PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text NOT NULL,
    action     text NOT NULL,
    subject    text NOT NULL,          -- e.g. 'tenant:acme', 'version:acme/support@v1'
    before     jsonb,
    after      jsonb
);
CREATE INDEX audit_log_subject_idx ON audit_log (subject, at);
CREATE INDEX audit_log_at_idx ON audit_log (at);

CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    topic        text NOT NULL,
    key          text NOT NULL,        -- Kafka key (adapter id, tenant id): order holds per key
    event_id     uuid NOT NULL UNIQUE,
    event_type   text NOT NULL,        -- fully qualified protobuf message name
    payload      bytea NOT NULL,       -- serialized protobuf message
    created_at   timestamptz NOT NULL DEFAULT now(),
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text,
    published_at timestamptz
);
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE processed_events (
    consumer     text NOT NULL,
    event_id     uuid NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- migrate:down
DROP TABLE processed_events;
DROP TABLE outbox;
DROP TABLE audit_log;
