"""ApiVersions (key 18), versions 0-4.

The advertised list is the route table itself (``routes.py``). A request version above 4
never reaches this handler: the connection answers it with the v0-layout fallback (error 35 and the
full key list, response header v0), which is what Java and kafka-python expect before
they retry with a version both sides know.

Features (v3+, tagged fields), as a Kafka 4.0 broker reports them (docs/compatibility.md):

- ``metadata.version``: supported 7-25 (3.3-IV3 to 4.0-IV3), finalized at 25 (4.0-IV3).
- ``group.version``: derived from the route table. Level 1 (KIP-848 consumer groups) is
  supported and finalized only when ConsumerGroupHeartbeat is served; otherwise only
  level 0 is supported and nothing is finalized (Kafka omits level-0 finalized features).

Deviations: Kafka omits supported features whose minimum is 0 below v4 (KAFKA-17492);
so does this broker. There is no feature log, so the finalized-features epoch is the sum
of the finalized levels: constant for one build, and it only grows when a build
finalizes a higher level. ``transaction.version`` and ``kraft.version`` are not
advertised (level 0: no transaction protocol v2, no KRaft quorum).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka.protocol.metadata import ApiVersionsResponse

from broker.handlers.registry import ApiHandler, RequestContext
from protocol.apis import ApiKey

_Key = ApiVersionsResponse.ApiVersion
_Supported = ApiVersionsResponse.SupportedFeatureKey
_Finalized = ApiVersionsResponse.FinalizedFeatureKey

METADATA_VERSION = "metadata.version"
GROUP_VERSION = "group.version"
METADATA_VERSION_MIN = 7  # 3.3-IV3, the oldest a Kafka 4.0 broker supports
METADATA_VERSION_4_0 = 25  # 4.0-IV3


def supported_features(routes: Mapping[int, ApiHandler]) -> dict[str, tuple[int, int]]:
    """Feature name -> (min, max) level this broker supports, given what it serves."""
    group_max = 1 if ApiKey.CONSUMER_GROUP_HEARTBEAT in routes else 0
    return {
        METADATA_VERSION: (METADATA_VERSION_MIN, METADATA_VERSION_4_0),
        GROUP_VERSION: (0, group_max),
    }


def finalized_features(routes: Mapping[int, ApiHandler]) -> dict[str, int]:
    """Feature name -> finalized level (features at level 0 are left out, as Kafka does)."""
    levels = {name: hi for name, (_lo, hi) in supported_features(routes).items()}
    return {name: level for name, level in levels.items() if level > 0}


async def api_versions(ctx: RequestContext, request: Any) -> Any:
    routes = ctx.broker.routes
    keys = [
        _Key(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(routes.values(), key=lambda a: a.key)
    ]
    resp = ApiVersionsResponse(error_code=0, api_keys=keys, throttle_time_ms=0)
    if ctx.header.api_version >= 3:
        below_v4 = ctx.header.api_version < 4
        resp.supported_features = [
            _Supported(name=name, min_version=lo, max_version=hi)
            for name, (lo, hi) in sorted(supported_features(routes).items())
            if not (below_v4 and lo == 0)
        ]
        finalized = finalized_features(routes)
        resp.finalized_features_epoch = sum(finalized.values())
        resp.finalized_features = [
            _Finalized(name=name, max_version_level=level, min_version_level=level)
            for name, level in sorted(finalized.items())
        ]
    return resp
