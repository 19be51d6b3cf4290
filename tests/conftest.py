"""Session fixtures shared by every test: real etcd, real S3 servers, real brokers.

gRPC's fork handlers are turned off before anything imports gRPC (broker/meta/__init__.py
says why): this process runs etcd clients and then forks Spark's JVM and other programs.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

pytest_plugins = ["tests.fixtures.etcd", "tests.fixtures.s3", "tests.fixtures.broker"]
