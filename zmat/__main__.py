"""``python -m zmat ...``: the :mod:`zmat.cli` command line."""

from .cli import main

raise SystemExit(main())
