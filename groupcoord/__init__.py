"""Consumer-group coordinator (classic protocol), independent of the broker and etcd.

The broker builds ``GroupCoordinator(MetaGroupStore(meta), GroupConfig(...))``; tests can
use any ``GroupStore``.
"""

from groupcoord.coordinator import GroupCoordinator
from groupcoord.model import (
    GroupConfig,
    GroupConflictError,
    GroupDescription,
    GroupListing,
    GroupRecord,
    GroupState,
    GroupStore,
    JoinedMember,
    JoinRequest,
    JoinResult,
    MemberDescription,
    MemberRecord,
    OffsetCommit,
    OffsetDeleteResult,
    OffsetRecord,
    StoredGroup,
    SyncResult,
    TopicPartition,
)

__all__ = [
    "GroupConfig",
    "GroupConflictError",
    "GroupCoordinator",
    "GroupDescription",
    "GroupListing",
    "GroupRecord",
    "GroupState",
    "GroupStore",
    "JoinRequest",
    "JoinResult",
    "JoinedMember",
    "MemberDescription",
    "MemberRecord",
    "OffsetCommit",
    "OffsetDeleteResult",
    "OffsetRecord",
    "StoredGroup",
    "SyncResult",
    "TopicPartition",
]
