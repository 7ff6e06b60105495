"""``python -m mixlab``: the same CLI as the ``mixlab`` console script.

``mixlab`` is an implicit namespace package (no ``__init__.py``); ``runpy`` still finds this module
in mixlab-shared's portion of it, so the command works whenever mixlab-shared is installed.
"""

import sys

from mixlab.shared.cli import main

if __name__ == "__main__":
    sys.exit(main())
