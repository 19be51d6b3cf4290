"""Session fixtures shared by every test: real etcd, real S3 servers, real brokers."""

pytest_plugins = ["tests.fixtures.etcd", "tests.fixtures.s3", "tests.fixtures.broker"]
