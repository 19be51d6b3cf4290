"""Checks of a ConsumerGroupHeartbeat request before it touches the group (Kafka's
request validation), and subscription regexes (docs/compatibility.md, KIP-848)."""

from __future__ import annotations

import re

from groupcoord.consumer_model import (
    JOIN_EPOCH,
    MAX_REGEX_CHARS,
    MAX_SUBSCRIBED_TOPICS,
    MAX_SUBSCRIPTION_BYTES,
    STATIC_LEAVE_EPOCH,
    ConsumerGroupConfig,
    HeartbeatError,
    HeartbeatRequest,
)
from protocol.errors import ErrorCode

_RE2_UNSUPPORTED = re.compile(r"\(\?(?:[=!]|<[=!]|P=)|\\[1-9]")


def compile_regex(regex: str) -> re.Pattern[str]:
    """Compile a subscription regex, refusing what RE2J (Kafka's regex engine) refuses and
    Python's ``re`` would accept: lookaround and backreferences."""
    if len(regex) > MAX_REGEX_CHARS:
        raise HeartbeatError(
            ErrorCode.INVALID_REGULAR_EXPRESSION,
            f"SubscribedTopicRegex is longer than {MAX_REGEX_CHARS} characters.",
        )
    if _RE2_UNSUPPORTED.search(regex):
        raise HeartbeatError(
            ErrorCode.INVALID_REGULAR_EXPRESSION,
            f"SubscribedTopicRegex `{regex}` is not a valid RE2J regular expression: "
            "lookaround and backreferences are not supported.",
        )
    try:
        return re.compile(regex)
    except re.error as exc:
        raise HeartbeatError(
            ErrorCode.INVALID_REGULAR_EXPRESSION,
            f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {exc}.",
        ) from exc


def validate(req: HeartbeatRequest, config: ConsumerGroupConfig) -> None:
    """Kafka's request checks; raises HeartbeatError."""

    def invalid(message: str) -> HeartbeatError:
        return HeartbeatError(ErrorCode.INVALID_REQUEST, message)

    if not req.group_id:
        raise invalid("GroupId can't be empty.")
    if req.instance_id == "":
        raise invalid("InstanceId can't be empty.")
    if req.rack_id == "":
        raise invalid("RackId can't be empty.")
    if req.epoch == JOIN_EPOCH:
        if req.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or any(req.owned.values()):
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if not req.topics and not req.regex:
            raise invalid(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif req.epoch == STATIC_LEAVE_EPOCH:
        if req.instance_id is None:
            raise invalid("InstanceId can't be null.")
    elif req.epoch < STATIC_LEAVE_EPOCH:
        raise invalid("MemberEpoch is invalid.")
    if req.epoch != JOIN_EPOCH and not req.member_id:
        raise invalid("MemberId can't be empty.")
    if req.topics is not None and (
        len(req.topics) > MAX_SUBSCRIBED_TOPICS
        or sum(len(t.encode()) for t in req.topics) > MAX_SUBSCRIPTION_BYTES
    ):
        raise invalid(
            f"SubscribedTopicNames is too large (at most {MAX_SUBSCRIBED_TOPICS} topics "
            f"and {MAX_SUBSCRIPTION_BYTES} bytes)."
        )
    if req.assignor is not None and req.assignor not in config.assignors:
        raise HeartbeatError(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {req.assignor} is not supported. "
            f"Supported assignors: {', '.join(config.assignors)}.",
        )
    if req.regex:
        compile_regex(req.regex)
