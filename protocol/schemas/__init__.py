"""Kafka message schemas (JSON, in Kafka's message-definition format) for APIs that
kafka-python 3.x does not model; ``protocol.consumer_groups`` builds classes from them."""
