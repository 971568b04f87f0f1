"""Who may do what on docker-compose.yml's Kafka broker: one table, one generated script.

The broker (apache/kafka, KRaft) authorizes every request (``StandardAuthorizer``,
``allow.everyone.if.no.acl.found=false``); a client is the subject of its certificate,
mapped by :data:`PRINCIPAL_MAPPING_RULES` to the identity's name (``CN=cache-manager`` ->
``User:cache-manager``, the names :mod:`loraplane.stack.certs` issues), and may do what
:data:`ACCESS` grants it and nothing else. :data:`SUPER_USER` (the broker's own certificate)
is the only super user: the broker needs it to talk to itself and its controller, and the
one-shot ``kafka-init`` service runs :func:`render_init_script`'s output with it, before
any loraplane service starts (``loraplane stack kafka-acls`` writes
:data:`INIT_SCRIPT`; ``tests/unit/test_compose.py`` checks the committed file is this
module's output and that it grants what the code uses, no more).

The script creates the topics of :data:`loraplane.shared.topics.TOPICS` (partitions and
configs of the table, ``--if-not-exists``) and adds the ACLs (``kafka-acls.sh --add`` of an
ACL that exists is a no-op): running it again changes nothing. It only adds: a grant taken
out of the table stays on an existing broker until removed with ``kafka-acls.sh --remove``.

The services create no topic on this broker: the ones that call
:func:`loraplane.shared.kafka_admin.ensure_topics` over the whole table at start
(``ensures_topics``) list the topics and find them all, which takes DESCRIBE on each
(READ and WRITE imply it). The embedded stack's Tansu (``make run``, ``make test``) has
no ACLs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from loraplane.admission.settings import AdmissionSettings
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.cache_manager.sharding import shard_group
from loraplane.registry.settings import RegistrySettings
from loraplane.shared import topics

SUPER_USER = "kafka"
"""The broker's certificate identity (``kafka-keystore.pem``): ``super.users``, alone."""
PRINCIPAL_MAPPING_RULES = "RULE:^CN=([a-z0-9-]+)$/$1/,DEFAULT"
"""``ssl.principal.mapping.rules``: a subject that is one CN of a service name becomes that
name; any other subject keeps its whole DN, which no ACL names."""
INIT_SCRIPT = Path("infra/kafka/init.sh")
"""Where ``loraplane stack kafka-acls`` writes the script (relative to the repository)."""
WORKER_GROUP_PREFIX = "loraplane-worker-"
"""Each worker's consumer group is this + its ``LORAPLANE_WORKER_ID`` (worker/app.py)."""

Operation = Literal["Read", "Write", "Describe"]
ResourceType = Literal["topic", "group"]
PatternType = Literal["literal", "prefixed"]


def _default(settings: type[BaseModel], field: str) -> str:
    """A settings field's default (the value compose leaves in place)."""
    value = settings.model_fields[field].default
    assert isinstance(value, str), (settings.__name__, field)
    return value


@dataclass(frozen=True, slots=True)
class Group:
    """A consumer group id, or every id starting with ``name`` (``prefixed``)."""

    name: str
    prefixed: bool = False


@dataclass(frozen=True, slots=True)
class Access:
    """What one identity does on the broker (a row of :data:`ACCESS`)."""

    principal: str
    """The identity: its certificate's CN, its compose service name."""
    produces: tuple[str, ...] = ()
    """Topics it writes."""
    consumes: tuple[str, ...] = ()
    """Topics it reads."""
    groups: tuple[Group, ...] = ()
    """Consumer groups it joins or commits offsets under (READ on the group)."""
    ensures_topics: bool = False
    """Calls ``ensure_topics`` over the whole table: DESCRIBE on the topics it neither
    reads nor writes, so it finds them all and creates none."""


ACCESS: tuple[Access, ...] = (
    Access(
        "registry",
        # the outbox relay: AdapterReleased, LifecycleEvent, TenantEvent
        produces=(topics.ADAPTER_RELEASES, topics.ADAPTER_LIFECYCLE, topics.TENANT_EVENTS),
        consumes=(topics.ADAPTER_ADMISSIONS,),  # registry.admissions.AdmissionConsumer
        groups=(Group(_default(RegistrySettings, "registry_consumer_group")),),
        ensures_topics=True,  # at start and before each relay producer
    ),
    Access(
        "admission",
        produces=(topics.ADAPTER_ADMISSIONS,),
        consumes=(topics.ADAPTER_RELEASES,),
        groups=(Group(_default(AdmissionSettings, "admission_consumer_group")),),
    ),
    Access(
        "cache-manager",
        produces=(topics.CACHE_COMMANDS,),  # kafka_io.CommandSink
        consumes=(topics.CACHE_STATE, topics.ADAPTER_ADMISSIONS, topics.ADAPTER_LIFECYCLE,
                  topics.ADAPTER_PREWARM, topics.ADAPTER_HEAT),  # kafka_io.INPUT_TOPICS
        # offsets under the deployment's group, or each shard's (LORAPLANE_CACHE_MANAGER_SHARDS)
        groups=(Group(_default(CacheManagerSettings, "cache_manager_consumer_group")),
                Group(shard_group(_default(CacheManagerSettings,
                                           "cache_manager_consumer_group"), ""),
                      prefixed=True)),
        ensures_topics=True,
    ),
    Access(
        "worker",
        produces=(topics.CACHE_STATE, topics.ADAPTER_HEAT),
        consumes=(topics.CACHE_COMMANDS,),
        groups=(Group(WORKER_GROUP_PREFIX, prefixed=True),),
    ),
    Access(
        "gateway",
        produces=(topics.ADAPTER_HEAT, topics.ADAPTER_PREWARM),  # gateway.emit
        # its views (gateway.consumers.ViewFeeder: every partition, no group)
        consumes=(topics.TENANT_EVENTS, topics.ADAPTER_ADMISSIONS, topics.ADAPTER_LIFECYCLE,
                  topics.CACHE_STATE),
        ensures_topics=True,
    ),
)
"""Every identity that may use the broker, with what it produces and consumes (the
operator's certificate, the CLI's, gets nothing: no command talks to Kafka)."""


@dataclass(frozen=True, slots=True, order=True)
class Acl:
    """One allow ACL (from any host)."""

    principal: str
    """``User:<identity>``."""
    operation: Operation
    resource_type: ResourceType
    name: str
    pattern: PatternType = "literal"


def acls(table: tuple[Access, ...] = ACCESS) -> list[Acl]:
    """The ACLs of ``table``, sorted."""
    out: set[Acl] = set()
    for row in table:
        user = f"User:{row.principal}"
        out.update(Acl(user, "Write", "topic", t) for t in row.produces)
        out.update(Acl(user, "Read", "topic", t) for t in row.consumes)
        if row.ensures_topics:
            used = {*row.produces, *row.consumes}
            out.update(Acl(user, "Describe", "topic", t) for t in topics.TOPICS if t not in used)
        out.update(Acl(user, "Read", "group", g.name, "prefixed" if g.prefixed else "literal")
                   for g in row.groups)
    return sorted(out)


_HEADER = """\
#!/usr/bin/env bash
# GENERATED by `loraplane stack kafka-acls` from loraplane.stack.kafka_acls.ACCESS and
# loraplane.shared.topics.TOPICS: do not edit (tests/unit/test_compose.py compares).
#
# docker-compose.yml's kafka-init service runs it once per `up`, before any loraplane
# service starts, as the broker's own certificate (the only super user): it creates the
# topics and adds each service's ACLs. Idempotent: an existing topic or ACL is left as is.
set -euo pipefail

bootstrap=kafka:9092
config=/tmp/admin.properties
printf '%s\\n' security.protocol=SSL ssl.keystore.type=PEM \\
  ssl.keystore.location=/etc/kafka/pki/keystore.pem ssl.truststore.type=PEM \\
  ssl.truststore.location=/etc/kafka/pki/ca.pem > "$config"

admin=(--bootstrap-server "$bootstrap" --command-config "$config")
# a broker just reported healthy can refuse a first admin call: each call is tried up to
# five times, 2 s apart, so one refusal does not leave every service waiting on this one
retry() { local n; for n in 1 2 3 4; do "$@" && return 0; sleep 2; done; "$@"; }
topics() { retry /opt/kafka/bin/kafka-topics.sh "${admin[@]}" "$@"; }
acls() { retry /opt/kafka/bin/kafka-acls.sh "${admin[@]}" --add "$@"; }
"""


def render_init_script(table: tuple[Access, ...] = ACCESS) -> str:
    """The shell script ``kafka-init`` runs: topics, then one ``kafka-acls.sh --add`` per
    principal, operation and pattern type (each grants exactly its operation on each
    resource named)."""
    lines = [_HEADER, "# topics (loraplane.shared.topics.TOPICS)"]
    for spec in topics.TOPICS.values():
        args = ["--create", "--if-not-exists", "--topic", spec.name,
                "--partitions", str(spec.partitions), "--replication-factor", "1"]
        for key, value in spec.configs.items():
            args += ["--config", f"{key}={value}"]
        lines.append(shlex.join(["topics", *args]))
    batches: dict[tuple[str, str, str, str], list[str]] = {}
    for acl in acls(table):
        batches.setdefault((acl.principal, acl.resource_type, acl.pattern, acl.operation),
                           []).append(acl.name)
    current = ""
    for (principal, kind, pattern, operation), names in batches.items():
        if principal != current:
            lines += ["", f"# {principal}"]
            current = principal
        args = ["--allow-principal", principal, "--operation", operation]
        if pattern != "literal":
            args += ["--resource-pattern-type", pattern]
        for name in names:
            args += [f"--{kind}", name]
        lines.append(shlex.join(["acls", *args]))
    return "\n".join(lines) + "\n"


def write_init_script(path: Path = INIT_SCRIPT) -> Path:
    """Write :func:`render_init_script` to ``path`` (executable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_init_script())
    path.chmod(0o755)
    return path
