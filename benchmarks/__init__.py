"""Benchmarks: every z-matrix -> Cartesian implementation on the same problems.

Run ``python -m benchmarks`` (a quick comparison, a few minutes on a laptop
CPU) or ``python -m benchmarks --help``. Modules:

* ``cases``: the problems (linear chains, batches of small molecules,
  full-atom proteins from the PDB files in ``tests/data``).
* ``seeds``: the users' NeRF loop (``../shared/seeds/003``), written here
  from their description: in-place writes, ``torch.cat`` per step, and a
  custom ``autograd.Function`` with a finite-difference backward.
* ``peers``: adapters for mp_nerf and chemcoord (the ``bench`` extra).
* ``registry``: the implementations, what each can run, how to call it.
* ``suites``: the grids (``quick``, ``methods``, ``targets``, ``full``, ``tiny``).
* ``worker`` / ``run``: one timed measurement in a child process, and the
  loop over a grid with time budgets and a progress bar.
* ``report``: the printed table, JSON, Markdown (every row, and a one-row-per-
  problem summary), the PNG, and the check of the README's targets.
"""
