"""Towards the backends: a broker on etcd over TLS (client certificate required, auth
enabled, user and password from ``KAFSCALE_ETCD_PASSWORD``) and on S3 over https with a
private CA (``--s3-ca-bundle``; SeaweedFS behind a TLS terminator made in the test)
produces and consumes; ``kafscale users`` works against that etcd; without the CA or
with a wrong password nothing connects."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tests.fixtures.broker import free_port, start_broker
from tests.fixtures.certs import Pki, make_pki
from tests.fixtures.s3 import S3Endpoint, create_bucket
from tests.integration.security.conftest import kafscale

pytestmark = pytest.mark.integration
ROOT_PW = "root-" + os.urandom(6).hex()


class TlsTerminator:
    """TLS on ``port`` (our server certificate), plaintext to ``target`` (a thread)."""

    def __init__(self, pki: Pki, target: int) -> None:
        self.port, self.target = free_port(), target
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(pki.server.cert, pki.server.key)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        writers: set[asyncio.StreamWriter] = set()

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                w.close()

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            br, bw = await asyncio.open_connection("127.0.0.1", self.target)
            writers.update((cw, bw))
            try:
                await asyncio.gather(pipe(cr, bw), pipe(br, cw))
            finally:
                writers.difference_update((cw, bw))

        async def serve() -> asyncio.Server:
            server = await asyncio.start_server(handle, "127.0.0.1", self.port, ssl=self.ctx)
            self.ready.set()
            return server

        server = self.loop.run_until_complete(serve())
        self.loop.run_forever()
        server.close()
        for w in list(writers):
            w.close()
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    def start(self) -> TlsTerminator:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def etcdctl(port: int, pki: Pki, client: object, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["etcdctl", f"--endpoints=https://127.0.0.1:{port}", f"--cacert={pki.ca}",
         f"--cert={client.cert}", f"--key={client.key}", *args],  # type: ignore[attr-defined]
        capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Pki, object]]:
    if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
        print("etcd/etcdctl not installed (scripts/setup.sh --test)")
        pytest.skip("etcd or etcdctl not installed")
    tmp = tmp_path_factory.mktemp("etcd-tls")
    pki = make_pki(tmp / "pki")
    client = pki.client("root")
    port, peer = free_port(), free_port()
    url = f"https://127.0.0.1:{port}"
    log = open(tmp / "etcd.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["etcd", "--name=tls", f"--data-dir={tmp / 'data'}", f"--listen-client-urls={url}",
         f"--advertise-client-urls={url}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-cluster=tls=http://127.0.0.1:{peer}", f"--cert-file={pki.server.cert}",
         f"--key-file={pki.server.key}", f"--trusted-ca-file={pki.ca}", "--client-cert-auth"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while etcdctl(port, pki, client, "endpoint", "health").returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.2)
        for cmd in (["user", "add", f"root:{ROOT_PW}"], ["auth", "enable"]):
            r = etcdctl(port, pki, client, *cmd)
            assert r.returncode == 0, r.stderr
        yield port, pki, client
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(15)
        log.close()


def etcd_flags(port: int, pki: Pki, client: object, password: bool = True) -> list[str]:
    out = ["--meta", f"etcd://127.0.0.1:{port}", "--etcd-ca", str(pki.ca),
           "--etcd-cert", str(client.cert), "--etcd-key", str(client.key),  # type: ignore[attr-defined]
           "--etcd-user", "root"]  # fmt: skip
    return out + (["--etcd-password", ROOT_PW] if password else [])


def test_users_cli_on_tls_etcd_and_refusals(secure_etcd: tuple[int, Pki, object]) -> None:
    port, pki, client = secure_etcd
    r = kafscale("users", *etcd_flags(port, pki, client), "--meta-prefix", "/cli",
                 "create", "carol", "--password", "pw")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = kafscale("users", *etcd_flags(port, pki, client), "--meta-prefix", "/cli", "list")
    assert r.returncode == 0 and r.stdout.startswith("carol "), r.stdout + r.stderr
    bad = etcd_flags(port, pki, client, password=False) + ["--etcd-password", "wrong"]
    r = kafscale("users", *bad, "--meta-prefix", "/cli", "list")
    assert r.returncode != 0
    no_tls = ["--meta", f"etcd://127.0.0.1:{port}", "--etcd-user", "root",
              "--etcd-password", ROOT_PW]  # fmt: skip
    r = subprocess.run(
        ["timeout", "60", *kafscale_cmd("users", *no_tls, "--meta-prefix", "/cli", "list")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode != 0


def kafscale_cmd(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "broker.cli", *args]


def test_broker_on_tls_etcd_and_https_s3(
    secure_etcd: tuple[int, Pki, object], seaweedfs_s3: S3Endpoint, tmp_path: Path
) -> None:
    port, pki, client = secure_etcd
    r = kafscale("users", *etcd_flags(port, pki, client), "--meta-prefix", "/b",
                 "create", "dave", "--password", "dave-pw")  # fmt: skip
    assert r.returncode == 0, r.stderr
    target = int(urllib.parse.urlsplit(seaweedfs_s3.url).port or 0)
    term = TlsTerminator(pki, target).start()
    try:
        bucket = create_bucket(seaweedfs_s3)
        https = seaweedfs_s3.store_url(bucket, "tls").replace(
            f"endpoint={seaweedfs_s3.url}", f"endpoint=https://127.0.0.1:{term.port}"
        )
        sasl = free_port()
        flags = etcd_flags(port, pki, client, password=False)[2:]  # --meta given below
        b = start_broker(
            tmp_path / "b", store_url=https, meta_url=f"etcd://127.0.0.1:{port}",
            extra_args=(*flags, "--meta-prefix", "/b", "--s3-ca-bundle", str(pki.ca),
                        "--listener", f"SASL_PLAINTEXT://127.0.0.1:{sasl}"),
            env={"KAFSCALE_ETCD_PASSWORD": ROOT_PW},
        )  # fmt: skip
        try:
            conf = {"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol":
                    "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-256",
                    "sasl.username": "dave", "sasl.password": "dave-pw"}  # fmt: skip
            p = Producer(conf)
            for i in range(5):
                p.produce("tls-backends", f"r{i}".encode())
            assert p.flush(30) == 0
            c = Consumer({**conf, "group.id": "tls-g", "auto.offset.reset": "earliest"})
            c.subscribe(["tls-backends"])
            got: list[bytes | None] = []
            deadline = time.monotonic() + 30
            while len(got) < 5 and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and m.error() is None:
                    got.append(m.value())
            c.close()
            assert got == [f"r{i}".encode() for i in range(5)]
        finally:
            b.stop()
        keys = _bucket_keys(seaweedfs_s3, bucket)
        assert any(k.endswith(".kfs") for k in keys), keys  # segments went over https
    finally:
        term.stop()


def _bucket_keys(endpoint: S3Endpoint, bucket: str) -> list[str]:
    from tests.fixtures.s3 import s3_client

    c = s3_client(endpoint)
    try:
        return [o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])]
    finally:
        c.close()


async def test_ranges_past_a_grpc_message_on_tls_etcd(secure_etcd: tuple[int, Pki, object]) -> None:
    """The TLS channel takes answers over 4 MiB too (the MetaStore contract's test, on it)."""
    from broker.meta.etcd import EtcdStore
    from broker.meta.etcd_secure import EtcdAuth
    from tests.unit.broker.meta.test_contract import test_ranges_and_keys_larger_than_a_grpc_message

    port, pki, client = secure_etcd
    auth = EtcdAuth("root", ROOT_PW, str(pki.ca), str(client.cert), str(client.key))  # type: ignore[attr-defined]
    store = EtcdStore.from_url(f"etcd://127.0.0.1:{port}", prefix="/large", auth=auth)
    try:
        await test_ranges_and_keys_larger_than_a_grpc_message(store)
    finally:
        await store.close()
