"""``python -m streamrec``: the same as the ``streamrec`` command."""

import sys

from streamrec.app.cli import main

sys.exit(main())
