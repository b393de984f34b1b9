"""Remove static members from a consumer group, as Kafka's admin `removeMembersFromConsumerGroup`.

A static member (KIP-345, `group.instance.id`) does not leave the group when it stops, so a
restart within the session timeout keeps its assignment without a rebalance. The price is that
a member that died is only noticed when its session times out. When we *know* it died, a
LeaveGroup request naming its `group.instance.id` (v3+, which aiokafka 0.14 does not have)
removes it at once and the group rebalances now.

The request is built with aiokafka's protocol structs and sent on an aiokafka client; the
version is the highest both this module (3-5) and the group coordinator support.

Wire format (LeaveGroup, api key 13):
- v3: group_id STRING, members ARRAY[member_id STRING, group_instance_id NULLABLE_STRING]
- v4: the same as compact (flexible) types with tagged fields; request header v2
- v5: each member also carries a nullable `reason` (KIP-800), shown in the broker's log
The response carries a top-level error code and one error code per member.

Passing a member id with the instance id removes only that incarnation: if the instance has
since come back under a new member id, the coordinator answers FENCED_INSTANCE_ID and leaves the
new one alone. With no member id (""), whoever holds the instance id now is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TypeAlias

from aiokafka import errors as Errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Array,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    String,
    TaggedFields,
)

from enhydra.kafka.clients import Admin, open_admin
from enhydra.logs import get_logger
from enhydra.settings import Connection

log = get_logger("enhydra.kafka.membership")

UNKNOWN_MEMBER_ID = ""
DEFAULT_REASON = "removed by enhydra: the instance was detected dead"


class FencedInstanceIdError(Errors.BrokerResponseError):
    """The instance id is held by a newer member than the one named: it came back."""

    errno = 82
    message = "FENCED_INSTANCE_ID"
    description = "The instance id is now used by another member (a newer incarnation)."


_EXTRA_ERRORS: dict[int, type[Errors.BrokerResponseError]] = {82: FencedInstanceIdError}

# Top-level errors after which asking (another) coordinator again may succeed.
_RETRY_ERRORS: tuple[type[Exception], ...] = (
    Errors.GroupCoordinatorNotAvailableError,
    Errors.NotCoordinatorForGroupError,
    Errors.GroupLoadInProgressError,
    Errors.KafkaConnectionError,
    Errors.NodeNotReadyError,
    Errors.RequestTimedOutError,
)


class MembershipError(Errors.KafkaError):
    """Members could not be removed; the message says why and what to check."""


# --------------------------------------------------------------------------- wire format


class LeaveGroupResponse_v3(Response):
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),
                ("error_code", Int16),
            ),
        ),
    )


class LeaveGroupResponse_v4(Response):
    API_KEY = 13
    API_VERSION = 4
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            CompactArray(
                ("member_id", CompactString("utf-8")),
                ("group_instance_id", CompactString("utf-8")),
                ("error_code", Int16),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class LeaveGroupResponse_v5(Response):
    API_KEY = 13
    API_VERSION = 5
    SCHEMA = LeaveGroupResponse_v4.SCHEMA


class LeaveGroupRequest_v3(RequestStruct):
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class LeaveGroupRequest_v4(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 13
    API_VERSION = 4
    RESPONSE_TYPE = LeaveGroupResponse_v4
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "members",
            CompactArray(
                ("member_id", CompactString("utf-8")),
                ("group_instance_id", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class LeaveGroupRequest_v5(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 13
    API_VERSION = 5
    RESPONSE_TYPE = LeaveGroupResponse_v5
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "members",
            CompactArray(
                ("member_id", CompactString("utf-8")),
                ("group_instance_id", CompactString("utf-8")),
                ("reason", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


LeaveGroupMembersStruct: TypeAlias = (
    LeaveGroupRequest_v3 | LeaveGroupRequest_v4 | LeaveGroupRequest_v5
)


class LeaveGroupMembersRequest(Request[LeaveGroupMembersStruct]):
    """LeaveGroup v3+ naming members by (member id, instance id); aiokafka picks the version."""

    API_KEY = 13

    def __init__(self, group_id: str, members: Iterable[tuple[str, str]], reason: str) -> None:
        self._group_id = group_id
        self._members = list(members)
        self._reason = reason

    def build(self, request_struct_class: type[LeaveGroupMembersStruct]) -> LeaveGroupMembersStruct:
        version = request_struct_class.API_VERSION
        if version == 3:
            return request_struct_class(self._group_id, self._members)
        if version == 4:
            members4 = [(member, instance, {}) for member, instance in self._members]
            return request_struct_class(self._group_id, members4, {})
        members5 = [(member, instance, self._reason, {}) for member, instance in self._members]
        return request_struct_class(self._group_id, members5, {})


def error_for(code: int) -> Errors.KafkaError | None:
    """The aiokafka error for a Kafka error code (None for 0), including those aiokafka lacks."""
    if code == 0:
        return None
    cls = _EXTRA_ERRORS.get(code) or Errors.for_code(code)
    if cls is Errors.UnknownError:
        return Errors.UnknownError(f"Kafka error code {code}")
    return cls()


# --------------------------------------------------------------------------- the call


Target: TypeAlias = "AIOKafkaClient | Admin | Connection | str"


@contextlib.asynccontextmanager
async def cluster_client(
    target: Target, *, timeout_s: float = 10.0
) -> AsyncIterator[AIOKafkaClient]:
    """aiokafka's low-level client for `target`: a client or admin as given (not closed here),
    else a new one built by the access layer from a Connection or bootstrap string (TLS, SASL).
    """
    if isinstance(target, AIOKafkaClient):
        yield target
    elif isinstance(target, AIOKafkaAdminClient):
        yield target._client
    else:
        request_timeout_ms = max(1000, int(timeout_s * 1000))
        async with open_admin(
            target, client_id="enhydra-membership", request_timeout_ms=request_timeout_ms
        ) as admin:
            yield admin._client


async def remove_static_members(
    target: Target,
    group_id: str,
    instance_ids: Iterable[str] | Mapping[str, str | None],
    *,
    reason: str = DEFAULT_REASON,
    timeout_s: float = 10.0,
) -> dict[str, Errors.KafkaError | None]:
    """Remove static members from `group_id` now; the group rebalances without them.

    `target` is a started client or admin client, a Connection, or a bootstrap string.
    `instance_ids` names the `group.instance.id`s to remove, or maps each to the member id of
    the incarnation to remove (then a newer incarnation is left alone and reported as
    FencedInstanceIdError). Returns, per instance id, None when it was removed, else the error:
    UnknownMemberIdError when it is not (or no longer) in the group. Coordinator moves and
    loading are retried until `timeout_s`; then, or on any other group-level error, raises
    MembershipError (KafkaAccessError when the cluster cannot be reached at all).
    """
    if isinstance(instance_ids, str):
        raise ValueError(
            f"instance ids must be a list or a mapping, not the string {instance_ids!r}: "
            f"pass [{instance_ids!r}]"
        )
    if isinstance(instance_ids, Mapping):
        wanted = dict(instance_ids)
    else:
        wanted = dict.fromkeys(instance_ids)
    for instance in wanted:
        if not isinstance(instance, str) or not instance:
            raise ValueError(
                f"group instance id {instance!r} is invalid: expected a non-empty string "
                "(the instance id the member joined with)"
            )
    if not group_id:
        raise ValueError("group id is empty: pass the consumer group (the application id)")
    if not wanted:
        return {}
    async with cluster_client(target, timeout_s=timeout_s) as client:
        return await _remove(client, group_id, wanted, reason, timeout_s)


async def _remove(
    client: AIOKafkaClient,
    group_id: str,
    wanted: dict[str, str | None],
    reason: str,
    timeout_s: float,
) -> dict[str, Errors.KafkaError | None]:
    request = LeaveGroupMembersRequest(
        group_id,
        [(member or UNKNOWN_MEMBER_ID, instance) for instance, member in wanted.items()],
        reason,
    )
    deadline = time.monotonic() + timeout_s
    backoff = 0.05
    while True:
        try:
            coordinator = await client.coordinator_lookup(CoordinationType.GROUP, group_id)
            response = await client.send(coordinator, request)
        except NotImplementedError as exc:  # the broker has no LeaveGroup v3..v5
            raise MembershipError(
                "the group coordinator does not support LeaveGroup v3 (removing a member by "
                "group.instance.id needs Kafka 2.4 or newer)"
            ) from exc
        except _RETRY_ERRORS as exc:
            if time.monotonic() + backoff > deadline:
                raise MembershipError(
                    f"could not remove {sorted(wanted)} from group {group_id!r} within "
                    f"{timeout_s:g} s: {type(exc).__name__}; the group coordinator is unavailable"
                ) from exc
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
            continue
        top = error_for(response.error_code)
        if top is None:
            break
        if isinstance(top, _RETRY_ERRORS) and time.monotonic() + backoff <= deadline:
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
            continue
        if isinstance(top, Errors.UnknownMemberIdError):  # no such group: nobody to remove
            return dict.fromkeys(wanted, top)
        raise MembershipError(
            f"LeaveGroup for {sorted(wanted)} in group {group_id!r} failed: "
            f"{type(top).__name__} ({top.message if hasattr(top, 'message') else top})"
        )
    results: dict[str, Errors.KafkaError | None] = {}
    for _member, instance, code, *_tags in response.members:
        results[instance] = error_for(code)
    for instance in wanted:  # a coordinator that answers without a member answered nothing
        results.setdefault(instance, Errors.UnknownMemberIdError())
    log.info(
        "static members removed",
        group=group_id,
        version=response.API_VERSION,
        removed=sorted(i for i, e in results.items() if e is None),
        errors={i: type(e).__name__ for i, e in results.items() if e is not None},
    )
    return results
