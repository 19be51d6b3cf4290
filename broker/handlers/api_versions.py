"""ApiVersions (key 18), versions 0-4.

The advertised list is the route table itself (``routes.py``). A request version above 4
never reaches this handler: the connection answers it with the v0-layout fallback (error 35 and the
full key list, response header v0), which is what Java and kafka-python expect before
they retry with a version both sides know. No features are advertised.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import ApiVersionsResponse

from broker.handlers.registry import RequestContext

_Key = ApiVersionsResponse.ApiVersion


async def api_versions(ctx: RequestContext, request: Any) -> Any:
    keys = [
        _Key(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(ctx.broker.routes.values(), key=lambda a: a.key)
    ]
    return ApiVersionsResponse(error_code=0, api_keys=keys, throttle_time_ms=0)
