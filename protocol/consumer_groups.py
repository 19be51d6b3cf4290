"""Codec classes for the KIP-848 consumer-group APIs, which kafka-python 3.x lacks.

ConsumerGroupHeartbeat (68) v0-1 and ConsumerGroupDescribe (69) v0-1, built by
kafka-python's own schema machinery from the JSON definitions in ``protocol/schemas``
(Kafka's message-definition format; docs/compatibility.md, KIP-848 consumer groups).
Importing this module registers them with ``protocol.codec`` (which imports it).
"""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.api_message import ApiMessage

    _SCHEMAS = "protocol.schemas"

    class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_SCHEMAS):  # type: ignore[call-arg]
        pass

    class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_SCHEMAS):  # type: ignore[call-arg]
        pass

    class ConsumerGroupDescribeRequest(ApiMessage, load_json=_SCHEMAS):  # type: ignore[call-arg]
        pass

    class ConsumerGroupDescribeResponse(ApiMessage, load_json=_SCHEMAS):  # type: ignore[call-arg]
        pass


HeartbeatAssignment: Any = ConsumerGroupHeartbeatResponse.Assignment
HeartbeatTopicPartitions: Any = HeartbeatAssignment.TopicPartitions
DescribedGroup: Any = ConsumerGroupDescribeResponse.DescribedGroup
DescribedMember: Any = DescribedGroup.Member
DescribedAssignment: Any = DescribedMember.Assignment
DescribedTopicPartitions: Any = DescribedAssignment.TopicPartitions

__all__ = [
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
]
