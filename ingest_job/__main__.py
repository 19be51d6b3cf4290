"""``python -m ingest_job ...`` and ``spark-submit ingest_job/__main__.py ...``."""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # spark-submit runs this file as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ingest_job.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
