"""``python -m zmat ...``: the :mod:`zmat.cli` command line (``convert``, ``build-kernel``)."""

from .cli import main

raise SystemExit(main())
