"""Topic names whose partitions the rendezvous hash spreads over every given broker.

Owners follow from the topic's name (``broker.cluster.rendezvous``), so a random name puts
all of a small topic's partitions on one broker now and then (1 in 128 for 8 partitions
over 2 brokers). A test that needs each broker to own some draws names until one does."""

from __future__ import annotations

import uuid

from broker.cluster import BrokerInfo, partition_key, rendezvous


def spread_topic(prefix: str, nodes: list[int], partitions: int) -> str:
    """A new topic name ``{prefix}-{hex}`` whose partitions hash to every node of ``nodes``."""
    brokers = [BrokerInfo(n, "", 0) for n in nodes]
    while True:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        owners = {
            getattr(rendezvous(partition_key(name, p), brokers), "node_id", None)
            for p in range(partitions)
        }
        if owners == set(nodes):
            return name
