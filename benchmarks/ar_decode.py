"""Same as ``studylib bench ar``: studylib vs HF generate vs the roofline, in one run."""

import sys

from studylib.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "ar", *sys.argv[1:]]))
