"""Entry point: ``python -m spark_analysis`` and ``spark-submit spark_analysis/__main__.py``."""

import os
import sys

if __package__ in (None, ""):
    # run as a script (spark-submit .../spark_analysis/__main__.py): make the
    # package importable from the directory above it
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spark_analysis.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
