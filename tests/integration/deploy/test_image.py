"""deploy/Dockerfile: what its image holds, built and run here without a container engine.

No Docker daemon runs where the tests run, so the test follows the Dockerfile itself. It
copies what the build stage's COPY lines name (less ``.dockerignore``'s patterns) into a
build context, builds the wheel as the stage's RUN does (``pip wheel``, with build
isolation), installs that wheel into a directory of its own, and runs the image's CMD (on
free loopback ports) from there, with a real Kafka client producing and consuming through
it. A package the image leaves out, or native parts that no longer build, fail here.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tests.fixtures.broker import REPO, BrokerProcess, free_port
from tests.integration.conftest import create_topic, unique_topic

pytestmark = pytest.mark.integration

DOCKERFILE = REPO / "deploy" / "Dockerfile"
TIMEOUT = 60.0


@dataclass
class Stage:
    """One ``FROM`` of a Dockerfile: what it copies from the build context, runs, starts."""

    name: str
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # sources, destination
    runs: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def stages(text: str) -> list[Stage]:
    """The stages of a Dockerfile (continuation lines joined, comments dropped)."""
    out: list[Stage] = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "FROM":
            words = rest.split()
            out.append(Stage(words[2] if len(words) == 3 and words[1].upper() == "AS" else ""))
        elif op == "COPY" and not rest.startswith("--from"):
            *srcs, dest = shlex.split(rest)
            out[-1].copies.append((srcs, dest))
        elif op == "RUN":
            out[-1].runs.append(rest)
        elif op == "CMD":
            out[-1].cmd = json.loads(rest)
    return out


def ignored(patterns: list[str]) -> Callable[[str, list[str]], set[str]]:
    """A ``shutil.copytree`` ignore function for ``.dockerignore``'s patterns (paths from
    the context's root; ``**/`` matches at any depth)."""

    def match(rel: str) -> bool:
        for p in patterns:
            if p.startswith("**/"):
                if fnmatch.fnmatch(rel, p[3:]) or fnmatch.fnmatch(rel, "*/" + p[3:]):
                    return True
            elif fnmatch.fnmatch(rel, p):
                return True
        return False

    def ignore(directory: str, names: list[str]) -> set[str]:
        base = Path(directory).relative_to(REPO)
        return {n for n in names if match((base / n).as_posix())}

    return ignore


def build_context(stage: Stage, ctx: Path) -> None:
    """Copy what ``stage``'s COPY lines take from the repository into ``ctx`` (standing
    for the stage's WORKDIR), as Docker would."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    ignore = ignored([x.strip() for x in lines if x.strip() and not x.startswith("#")])
    for srcs, dest in stage.copies:
        target = ctx / dest
        for src in srcs:
            path = REPO / src
            if path.is_dir():
                shutil.copytree(path, target, ignore=ignore, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name if dest.endswith("/") else target)


def packages() -> set[str]:
    """The repository's top-level packages that pyproject.toml's ``include`` names."""
    text = (REPO / "pyproject.toml").read_text()
    include = re.search(r"\[tool\.setuptools\.packages\.find\]\s*include = \[([^]]*)\]", text)
    assert include is not None
    globs = re.findall(r'"([^"]+)"', include.group(1))
    return {
        d.name
        for d in REPO.iterdir()
        if (d / "__init__.py").is_file() and any(fnmatch.fnmatch(d.name, g) for g in globs)
    }


def extensions() -> list[str]:
    """The native extensions setup.py builds (module names)."""
    return re.findall(r'Extension\(\s*"([^"]+)"', (REPO / "setup.py").read_text())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build stage's wheel, installed into a directory of its own."""
    build = next(s for s in stages(DOCKERFILE.read_text()) if s.name == "build")
    assert any(r.startswith("pip wheel") for r in build.runs), build.runs
    root = tmp_path_factory.mktemp("image")
    ctx, wheels, target = root / "src", root / "wheels", root / "site"
    build_context(build, ctx)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(ctx)], check=True)
    (wheel,) = wheels.glob("kafscale-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    missing_pkgs = {p for p in packages() if f"{p}/__init__.py" not in names}
    assert not missing_pkgs, f"the image's wheel lacks {sorted(missing_pkgs)}"
    for ext in extensions():
        pattern = ext.replace(".", "/") + ".cpython-*.so"
        assert any(fnmatch.fnmatch(n, pattern) for n in names), f"no {ext} in the wheel"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    return target


def _env(target: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    env["PYTHONPATH"] = str(target)  # the wheel's packages, before the checkout's editable ones
    return env


def test_the_wheel_serves_the_broker_and_its_native_parts(installed: Path, tmp_path: Path) -> None:
    modules = sorted(packages()) + extensions()
    probe = "import importlib, json, sys; print(json.dumps({m: importlib.import_module(m)"
    probe += ".__file__ for m in sys.argv[1:]}))"
    out = subprocess.run(
        [sys.executable, "-c", probe, *modules],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        check=True,
    )
    files = json.loads(out.stdout)
    elsewhere = {m: f for m, f in files.items() if not f.startswith(str(installed))}
    assert not elsewhere, f"imported from outside the installed wheel: {elsewhere}"


def test_the_image_command_serves_a_kafka_client(installed: Path, tmp_path: Path) -> None:
    """The final stage's CMD, its addresses moved to free loopback ports."""
    cmd = stages(DOCKERFILE.read_text())[-1].cmd
    assert cmd[:2] == ["kafscale", "broker"], cmd
    port, http = free_port(), free_port()
    moved = {"0.0.0.0:9092": f"127.0.0.1:{port}", "0.0.0.0:8080": f"127.0.0.1:{http}"}
    args = [moved.get(a, a) for a in cmd[2:]]
    assert sorted(set(args) & set(moved.values())) == sorted(moved.values()), cmd
    proc = BrokerProcess(
        tmp_path, port, args, _env(installed), command=(str(installed / "bin" / "kafscale"),)
    ).start()
    try:
        bootstrap = proc.bootstrap
        topic = unique_topic("image")
        create_topic(bootstrap, topic, 2)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        sent = [f"record {i}".encode() for i in range(40)]
        acked: list[bytes | None] = []
        for i, value in enumerate(sent):
            producer.produce(
                topic,
                value,
                partition=i % 2,
                on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None,
            )
        assert producer.flush(TIMEOUT) == 0
        assert Counter(acked) == Counter(sent)
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
        )
        got: list[bytes | None] = []
        try:
            consumer.subscribe([topic])
            for _ in range(200):
                if len(got) >= len(sent):
                    break
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
        finally:
            consumer.close()
        assert Counter(got) == Counter(sent)  # each once, none lost
        for path in ("/readyz", "/metrics"):
            with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=TIMEOUT) as r:
                assert r.status == 200, path
    finally:
        assert proc.stop() == 0, proc.log_text()
