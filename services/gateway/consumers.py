"""Kafka → in-memory views: the topics the gateway follows, replayed from the beginning.

The gateway owns nothing durable, so it reads its topics without a consumer group
from the earliest offset at every start (the views are idempotent: keys are
sticky-revoked, pointers last-writer-wins by event time, snapshots ordered by
``(started_at, seq)``) and then follows them. On any consumer failure (broker
restart, network) the consumer is closed, and a fresh one replays again after a
backoff, so a broker loss never leaves a silently stuck consumer
(:class:`loraplane.shared.consumer.ConsumerLoop`; this module is the handler).

``caught_up`` is set after the first empty poll once records stopped arriving, or
when no record at all arrived for ``empty_grace_s`` (empty topics: a fresh stack). A few
empty polls are not enough: the first fetch from a loaded broker can take longer than
that, and a gateway that declared its key view loaded before the keys arrived answered
valid keys with 401 (found by ``make stress``, gateway_restart). It gates readiness and
the key view's ``loaded`` (the view keeps following afterwards).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from loraplane.shared.codec import CodecError, decode_record
from loraplane.shared.consumer import Consumer, ConsumerLoop, Ready
from loraplane.shared.kafka_client import KafkaConnection

log = logging.getLogger(__name__)

Handler = Callable[[Any], None]
"""Applies one decoded event (the topic's message type) to a view (synchronous, no I/O)."""


class ViewFeeder:
    """Follows ``handlers``' topics from the beginning and applies every event."""

    def __init__(
        self,
        kafka: KafkaConnection,
        handlers: Mapping[str, Handler],
        *,
        client_id: str = "loraplane-gateway",
        retry_backoff_s: float = 1.0,
        poll_timeout_ms: int = 200,
        empty_grace_s: float = 10.0,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        """``handlers``: topic → handler; ``on_event(topic)`` counts applied events."""
        self._kafka = kafka
        self._handlers = dict(handlers)
        self._client_id = client_id
        self._on_event = on_event
        self.loop = ConsumerLoop(
            "view", factory=self._new_consumer, on_record=self._record, commit=False,
            backoff=lambda _attempt: retry_backoff_s, poll_timeout_ms=poll_timeout_ms,
            max_records=2000, ready_when=Ready.CAUGHT_UP, empty_grace_s=empty_grace_s,
        )
        self.caught_up = self.loop.ready
        """Set once the first replay reached the end of the topics."""
        self.malformed = 0
        """Records skipped because they did not decode."""

    async def run(self) -> None:
        """Consume until cancelled, recreating the consumer after failures."""
        await self.loop.run()

    def _new_consumer(self) -> Consumer:
        from aiokafka import AIOKafkaConsumer

        consumer: Consumer = AIOKafkaConsumer(
            *self._handlers,
            **self._kafka.client_args(),
            client_id=self._client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=5000,
        )
        return consumer

    async def _record(self, record: object) -> None:
        self._apply(record)

    @property
    def restarts(self) -> int:
        """Consumers recreated after a failure."""
        return self.loop.restarts

    def _apply(self, record: object) -> None:
        topic = getattr(record, "topic", "")
        try:
            msg = decode_record(record)  # type: ignore[arg-type]
        except CodecError:
            self.malformed += 1
            log.warning("skipping a malformed record on %s", topic, exc_info=True)
            return
        try:
            self._handlers[topic](msg)
        except Exception:  # a bad event must not stop the view
            log.exception("applying an event of %s failed", topic)
            return
        if self._on_event is not None:
            self._on_event(topic)
