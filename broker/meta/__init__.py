"""Metadata stores (``base.open_meta``: embedded or etcd).

gRPC (the etcd client's transport) is told not to install its fork handlers, before it
is first imported: a process that uses etcd and then starts another program (the ingest
job's Spark JVM, a test's broker) forks and execs at once, which is safe without them,
while the handlers, run with other threads inside gRPC, can leave the child broken so
that the program never starts (grpc/grpc issue 13873; seen here as Spark's "Java gateway
process exited" after in-process etcd clients). A value set by the user is kept.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
