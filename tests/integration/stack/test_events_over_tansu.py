"""Protobuf events through the real broker: the shared consumer loop (commit after the
handler, a failed record read again) and bare aiokafka, both with the shared codec, keys
and topic table."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from loraplane.shared import codec, topics
from loraplane.shared.consumer import ConsumerLoop, Ready
from loraplane.shared.kafka_admin import GROUP_TUNING
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2


def _released(tenant: str, version: str) -> events_pb2.AdapterReleased:
    ref = common_pb2.AdapterRef(tenant_id=tenant, adapter_name="support", version=version,
                                base_model="loraplane/tiny-llama")
    return events_pb2.AdapterReleased(meta=topics.new_meta("test", ref), engine_id=7, rank=8,
                                      sha256="ab" * 32, size_bytes=1234,
                                      target_modules=["q_proj", "v_proj"])


async def test_consumer_loop_commits_after_the_handler_and_a_new_consumer_resumes(
        stack: Stack, unique: str) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    group = f"loop-{unique}"
    sent = [_released(f"t{unique}", f"v{i}") for i in range(3)]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for msg in sent:
            value, headers = codec.encode(msg)
            await producer.send_and_wait(topics.ADAPTER_RELEASES, value,
                                         key=topics.key_for(topics.ADAPTER_RELEASES, msg),
                                         headers=codec.kafka_headers(headers))
    finally:
        await producer.stop()

    def factory() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(topics.ADAPTER_RELEASES, bootstrap_servers=bootstrap,
                                group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", **GROUP_TUNING)

    got: list[events_pb2.AdapterReleased] = []
    failed_once: list[str] = []

    async def handle(record: object) -> None:
        msg = codec.decode_record(record)  # type: ignore[arg-type]
        assert isinstance(msg, events_pb2.AdapterReleased)
        if msg.meta.adapter.tenant_id != f"t{unique}":
            return
        if msg.meta.adapter.version == "v1" and not failed_once:
            failed_once.append("v1")
            raise ConnectionError("effect not durable")  # not committed: read again
        got.append(msg)

    loop = ConsumerLoop("test", factory=factory, on_record=handle, probe_interval_s=1.0,
                        backoff=lambda _a: 0.1)
    task = asyncio.create_task(loop.run())
    try:
        async with asyncio.timeout(60):
            while [m.meta.adapter.version for m in got][-2:] != ["v1", "v2"]:
                await asyncio.sleep(0.05)
    finally:
        loop.stop()
        await asyncio.wait_for(task, 30)
    assert loop.consumers_started == 2  # the failure recreated the consumer
    versions = [m.meta.adapter.version for m in got]
    assert versions.count("v0") >= 1 and versions.count("v1") == 1 and versions[-1] == "v2"

    # everything handled was committed: a fresh consumer of the group reads none of them
    again: list[str] = []

    async def late(record: object) -> None:
        msg = codec.decode_record(record)  # type: ignore[arg-type]
        if msg.meta.adapter.tenant_id == f"t{unique}":  # type: ignore[attr-defined]
            again.append(msg.meta.adapter.version)  # type: ignore[attr-defined]

    second = ConsumerLoop("test-2", factory=factory, on_record=late, ready_when=Ready.ASSIGNED)
    task = asyncio.create_task(second.run())
    try:
        await asyncio.wait_for(second.ready.wait(), 30)
        await asyncio.sleep(1.5)  # several polls from the committed offsets
    finally:
        second.stop()
        await asyncio.wait_for(task, 30)
    assert again == []


async def test_aiokafka_codec_key_and_headers(stack: Stack, unique: str) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    sent = _released(f"a{unique}", "v2")
    value, headers = codec.encode(sent)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topics.ADAPTER_RELEASES, value,
                                     key=topics.key_for(topics.ADAPTER_RELEASES, sent),
                                     headers=codec.kafka_headers(headers))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topics.ADAPTER_RELEASES, bootstrap_servers=bootstrap,
                                group_id=f"ak-{unique}", auto_offset_reset="earliest",
                                enable_auto_commit=False, session_timeout_ms=6000,
                                heartbeat_interval_ms=500)
    await consumer.start()
    found = None
    try:
        async with asyncio.timeout(30):
            while found is None:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for rec in records:
                        msg = codec.decode_record(rec)
                        if msg.meta.adapter.tenant_id == f"a{unique}":  # type: ignore[attr-defined]
                            found = (rec, msg)
    finally:
        await consumer.stop()
    rec, msg = found
    assert msg == sent
    assert rec.key == f"a{unique}/support".encode()
    assert codec.header_event_id(rec.headers) == sent.meta.event_id


async def test_every_topic_exists_with_its_partitions(stack: Stack) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics.TOPICS))
    finally:
        await admin.close()
    partitions = {d["topic"]: len(d["partitions"]) for d in described}
    assert partitions == {name: spec.partitions for name, spec in topics.TOPICS.items()}


class _Executor:
    """The worker's command executor without an engine: records what ran, in order."""

    def __init__(self, worker_id: str, gate: asyncio.Event) -> None:
        self.worker_id = worker_id
        self.gate = gate
        self.ran: list[str] = []

    def is_mine(self, cmd: events_pb2.CacheCommand) -> bool:
        return cmd.worker_id == self.worker_id

    async def execute(self, cmd: events_pb2.CacheCommand) -> events_pb2.WorkerReport:
        if cmd.command_id.endswith("-slow"):
            await self.gate.wait()
        self.ran.append(cmd.command_id)
        return events_pb2.WorkerReport(worker_id=self.worker_id)


class _Reports:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def publish(self, topic: str, msg: events_pb2.WorkerReport) -> bool:
        self.sent.append(topic)
        return True


async def test_worker_command_consumer_keeps_order_per_adapter_and_resumes_after_commit(
        stack: Stack, unique: str) -> None:
    from loraplane.worker.kafka import CommandConsumer

    bootstrap = stack.settings.kafka_bootstrap
    worker = f"w-{unique}"
    ref = common_pb2.AdapterRef(tenant_id=f"t{unique}", adapter_name="a", version="v1",
                                base_model="loraplane/tiny-llama")

    def command(cid: str, engine_id: int) -> events_pb2.CacheCommand:
        return events_pb2.CacheCommand(
            meta=topics.new_meta("test", ref), command_id=cid, worker_id=worker,
            load=events_pb2.LoadAdapter(engine_id=engine_id, artifact_uri="s3://b/k/",
                                        sha256="ab" * 32, size_bytes=1, rank=8))

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        # one worker id: one key, one partition, so the log order is the send order
        for cmd in (command("c1-slow", 1), command("c2", 1), command("c3", 2)):
            value, headers = codec.encode(cmd)
            await producer.send_and_wait(topics.CACHE_COMMANDS, value,
                                         key=topics.key_for(topics.CACHE_COMMANDS, cmd),
                                         headers=codec.kafka_headers(headers))
    finally:
        await producer.stop()

    gate = asyncio.Event()
    executor, reports = _Executor(worker, gate), _Reports()
    consumer = CommandConsumer(stack.settings.kafka(), executor, reports,  # type: ignore[arg-type]
                               group_id=f"worker-{unique}")
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(60):
            while executor.ran != ["c3"]:  # another engine id does not wait for c1
                await asyncio.sleep(0.05)
        consumer.request_restart()  # nothing committed past c1: c1..c3 come again
        async with asyncio.timeout(60):
            while consumer.restarts < 1 or not consumer.assigned.is_set():
                await asyncio.sleep(0.05)
        gate.set()
        async with asyncio.timeout(60):
            # the first consumer's c1-slow and c2 finish (a restart does not cancel them),
            # and the second consumer runs all three again
            while min(executor.ran.count(c) for c in ("c1-slow", "c2", "c3")) < 2:
                await asyncio.sleep(0.05)
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 30)
    first_c1 = executor.ran.index("c1-slow")
    assert executor.ran.index("c2") > first_c1  # c2 waited behind c1 (same engine id)
    assert set(reports.sent) == {topics.CACHE_STATE}

    # everything was executed and committed: a new consumer of the group gets nothing
    opened = asyncio.Event()
    opened.set()  # anything handed out again runs at once and fails the assertion below
    again = _Executor(worker, opened)
    late = CommandConsumer(stack.settings.kafka(), again, _Reports(),  # type: ignore[arg-type]
                           group_id=f"worker-{unique}")
    task = asyncio.create_task(late.run())
    try:
        await asyncio.wait_for(late.assigned.wait(), 30)
        await asyncio.sleep(1.5)
    finally:
        late.stop()
        await asyncio.wait_for(task, 30)
    assert again.ran == []
