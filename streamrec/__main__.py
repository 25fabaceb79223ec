"""``python -m streamrec``: the same as the ``streamrec`` command."""

import sys

from streamrec.app.cli import main

if __name__ == "__main__":  # not when a spawned child process re-imports the parent's main module
    sys.exit(main())
