"""``python -m zmat ...``: the :mod:`zmat.cli` command line, and
``python -m zmat build-kernel``: compile the CPU kernel ahead (images, clusters)."""

import sys


def _build_kernel(argv: list[str]) -> int:
    import argparse

    from . import _kernel

    p = argparse.ArgumentParser(
        prog="python -m zmat build-kernel",
        description="Compile zmat's CPU kernel into its cache (ZMAT_KERNEL_DIR, else ~/.cache/zmat) "
        "and print the library's path.",
    )
    p.parse_args(argv)
    try:
        path = _kernel.build()
    except Exception as error:  # no compiler, a read-only cache...
        print(f"zmat: error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if sys.argv[1:2] == ["build-kernel"]:
    raise SystemExit(_build_kernel(sys.argv[2:]))

from .cli import main  # noqa: E402

raise SystemExit(main())
