"""librdkafka's mock cluster, held through librdkafka's C API (``ctypes``).

The benchmarks' counterpart is the mock cluster that librdkafka builds into a client
when ``test.mock.num.brokers`` is set. Its topics are created on first use with 4
partitions, and it answers no CreateTopics request; its C API
(``rd_kafka_mock_topic_create``) creates one with any partition count. confluent-kafka
does not expose that API, so ``MockCluster`` makes its own client handle in the same
librdkafka that confluent-kafka loads (the wheel's bundled library, else the system's)
and creates topics through it. The partition sweep uses this to run the mock at the
partition counts it runs the broker at (docs/benchmarks.md, "Round 29").
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

_PRODUCER = 0  # rd_kafka_type_t RD_KAFKA_PRODUCER
_ERRSTR = 512


def _library() -> ctypes.CDLL:
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    bundled = sorted(libs.glob("librdkafka*.so*"))
    name = str(bundled[0]) if bundled else ctypes.util.find_library("rdkafka")
    if name is None:
        raise RuntimeError("librdkafka not found (pip install confluent-kafka)")
    lib = ctypes.CDLL(name)
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]  # fmt: skip
    lib.rd_kafka_conf_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_handle_mock_cluster.restype = ctypes.c_void_p
    lib.rd_kafka_handle_mock_cluster.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                               ctypes.c_int]  # fmt: skip
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    return lib


class MockCluster:
    """One mock broker (``rtt_ms``: its simulated round trip, ``test.mock.broker.rtt``),
    alive until ``close``."""

    def __init__(self, rtt_ms: int = 0) -> None:
        self._lib = lib = _library()
        err = ctypes.create_string_buffer(_ERRSTR)
        conf = lib.rd_kafka_conf_new()
        settings = {"test.mock.num.brokers": "1", "log_level": "3"}
        if rtt_ms:
            settings["test.mock.broker.rtt"] = str(rtt_ms)
        for key, value in settings.items():
            if lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), err, _ERRSTR) != 0:
                lib.rd_kafka_conf_destroy(conf)
                raise RuntimeError(f"mock cluster: {key}: {err.value.decode()}")
        self._rk = lib.rd_kafka_new(_PRODUCER, conf, err, _ERRSTR)  # takes the conf
        if not self._rk:
            raise RuntimeError(f"mock cluster: {err.value.decode()}")
        self._cluster = lib.rd_kafka_handle_mock_cluster(self._rk)
        self.bootstrap: str = lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with ``partitions`` partitions (replication factor 1)."""
        code = self._lib.rd_kafka_mock_topic_create(self._cluster, name.encode(), partitions, 1)
        if code != 0:
            reason = self._lib.rd_kafka_err2str(code).decode()
            raise RuntimeError(f"mock cluster: creating {name}: {reason}")

    def close(self) -> None:
        if self._rk:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None
