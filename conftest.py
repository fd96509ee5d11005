"""Repository-level pytest configuration: doctest collection of ``zmat/``.

``--doctest-modules`` (``pyproject.toml``) imports every module under ``zmat/``;
modules that need an optional dependency are left out when it is missing, and
every doctest sees ``zmat``, ``torch`` and ``np`` without importing them.
"""

import importlib.util

import numpy as np
import pytest
import torch

import zmat

# module (relative to this directory) -> the optional package it imports
_OPTIONAL = {"zmat/rdkit.py": "rdkit"}

collect_ignore = [path for path, pkg in _OPTIONAL.items() if importlib.util.find_spec(pkg) is None]
# generator scripts of stored reference outputs: they import their reference (bgflow, AlphaFold, OpenMM)
collect_ignore_glob = ["tests/data/*.py"]


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    doctest_namespace.update(zmat=zmat, torch=torch, np=np)
