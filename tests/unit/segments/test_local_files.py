"""segments.local_files.unjournaled_ext4 over a sysfs tree built in the test (the
kernel's layout: ``dev/block/<major>:<minor>`` links to the device, ``fs/ext4/<device>/
journal_task`` reads ``<none>`` when the file system has no journal), and the warning
``LocalStore.from_url`` logs for such a directory."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from segments import local_files
from segments.local_files import unjournaled_ext4
from segments.local_store import LocalStore


def sysfs(tmp_path: Path, data: Path, journal_task: str | None) -> Path:
    """A sysfs tree in which ``data``'s device is ``vdz`` with this ``journal_task``
    (None: not an ext4 file system)."""
    root = tmp_path / "sys"
    device = root / "devices" / "pci0" / "virtio9" / "block" / "vdz"
    device.mkdir(parents=True)
    dev = os.stat(data).st_dev
    (root / "dev" / "block").mkdir(parents=True)
    (root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(device)
    if journal_task is not None:
        (root / "fs" / "ext4" / "vdz").mkdir(parents=True)
        (root / "fs" / "ext4" / "vdz" / "journal_task").write_text(journal_task + "\n")
    return root


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.mark.parametrize(
    ("journal_task", "expected"),
    [("<none>", "vdz"), ("1234", None), (None, None)],
    ids=["no-journal", "journal", "not-ext4"],
)
def test_unjournaled_ext4(
    tmp_path: Path,
    data: Path,
    monkeypatch: pytest.MonkeyPatch,
    journal_task: str | None,
    expected: str | None,
) -> None:
    monkeypatch.setattr(local_files, "SYS_ROOT", str(sysfs(tmp_path, data, journal_task)))
    assert unjournaled_ext4(str(data)) == expected


def test_no_sysfs_is_no_answer(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_files, "SYS_ROOT", str(tmp_path / "absent"))
    assert unjournaled_ext4(str(data)) is None
    assert unjournaled_ext4(str(tmp_path / "no-such-dir")) is None


@pytest.mark.parametrize("journal_task", ["<none>", "1234"])
def test_from_url_warns_once_about_a_file_system_without_a_journal(
    tmp_path: Path,
    data: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    journal_task: str,
) -> None:
    monkeypatch.setattr(local_files, "SYS_ROOT", str(sysfs(tmp_path, data, journal_task)))
    with caplog.at_level(logging.WARNING, logger="segments.local_store"):
        store = LocalStore.from_url(f"file://{data}")
    assert store.root == str(data)
    warned = [r.getMessage() for r in caplog.records if "without a journal" in r.getMessage()]
    message = (
        f"local store {data} is on ext4 without a journal (vdz): after a crash the file "
        "system needs fsck, a flush cycle's syncfs barriers are slow there, and every new "
        "segment file costs more CPU the more files were deleted in the last minutes "
        "(docs/operations.md, Tuning)"
    )
    assert warned == ([message] if journal_task == "<none>" else [])
