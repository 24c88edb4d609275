"""``python -m gradc``: the ``gradc`` command (:mod:`gradc.tools.cli`)."""
import sys

from gradc.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
