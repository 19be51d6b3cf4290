"""Listing files under a table location through pyiceberg's FileIO (local or S3)."""

from __future__ import annotations

from pyarrow.fs import FileSelector, FileType
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO


def list_files(io: FileIO, location: str) -> list[tuple[str, float]]:
    """(URI, modification time in seconds) of every file under ``location``."""
    pio = io if isinstance(io, PyArrowFileIO) else PyArrowFileIO(io.properties)
    scheme, netloc, path = PyArrowFileIO.parse_location(location, pio.properties)
    fs = pio.fs_by_scheme(scheme, netloc)
    infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    out: list[tuple[str, float]] = []
    for info in infos:
        if info.type != FileType.File:
            continue
        uri = f"{scheme}://{info.path}" if scheme != "file" else f"file://{info.path}"
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        out.append((uri, mtime))
    return out
