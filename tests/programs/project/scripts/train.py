"""``python scripts/train.py TOTAL_EPOCHS SAVE_EVERY [--config PATH]``, from the project root.

Python puts this file's directory (scripts/) first on sys.path, not the
working directory, so, as real projects do, the script adds the project
root to import its package.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from proj.report import report  # noqa: E402

if __name__ == "__main__":
    report(__name__, "script " + sys.argv[0])
