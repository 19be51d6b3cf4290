"""The built-in schema registry (Confluent Schema Registry REST API), docs/registry.md."""
