"""Compiled CPU kernel for the analytic method (batch-1 latency).

Eager PyTorch pays a dispatch floor of a few microseconds per op, and the
analytic method dispatches about a hundred ops per call: for one structure
that floor, not the arithmetic, is the cost. On CPU tensors the same
placement and the same Abe-Go backward (see ``zmat/_analytic.py``) run here as
loops of C++ (``zmat/csrc/rigid_forest.cpp``):

* forward: one pass over the atoms in depth-first order, ``F_j = F_parent(j) . L_j``
  with ``L`` built from the plan's effective internal coordinates (missing
  references and offset chains resolved by the same gather as the torch path);
* backward: the subtree sums in reverse depth-first order, then ``d r``,
  ``d theta``, ``d phi_eff`` per atom, scattered back through the gather;
* for proteins built from torsions, the fill of the internal coordinates
  (:func:`fill`, ``zmat.protein.build.fill_internal``'s math) and its
  gradient: a step of ``ProteinBatch.to_xyz`` below :data:`PARALLEL_ATOMS`
  then enters no parallel region, which on a shared machine waits for a busy
  core;
* torsion updates of molecules (:func:`torsions`, ``zmat/csrc/torsions.cpp``):
  ``TorsionSpace.to_xyz``'s rigid route and its gradient;
* the normalizing flows' Cartesian -> internal rows (:func:`internal`,
  ``zmat/csrc/internal.cpp``), their rigid motions (:func:`move`,
  ``zmat/csrc/move.cpp``), the global forward's tree rotations (:func:`euler`,
  ``zmat/csrc/euler.cpp``) and the gradients.

Calls of at least :data:`PARALLEL_ATOMS` atoms in all split over
``torch.get_num_threads()`` threads (``zmat/csrc/parallel.h``: torch's own
OpenMP team where its libgomp is loaded): structures, or runs of whole trees
(placement), ranges of atoms (the fill), handed out one at a time, with the
same bits on any number of threads; smaller calls stay on the calling thread.

Build: the kernel is plain C++ behind a C ABI (raw pointers, sizes, strides;
no torch headers), compiled by invoking the C++ compiler (``$CXX``, else
``c++``) directly on the first CPU call (not at ``import zmat``), which takes
about 7 s of one idle core (measured: 7 s of compiler CPU time; 30 s of wall
time on a loaded 2-core machine) and says so in one line on stderr, ending
with the time it took; ``python -m zmat build-kernel`` builds it ahead. (Not
at install time: a build step needing torch would pull a CUDA torch into
pip's isolated build environment.) The library is cached in :func:`cache_dir`
under a name hashed from what the build depends on (the sources, the
compiler binary, the flags, the torch version), so a different ``PATH`` or
another virtual environment with the same compiler loads the same file.
Processes building at once each compile to a private file and rename it into
place (atomic), so none ever loads a partial one. It is loaded with ctypes:
the eager autograd Functions below call it directly (the lowest per-call
cost), and it is registered as ``torch.library`` operators (``zmat::place``,
``zmat::fill``, ``zmat::torsions``, ... with fake implementations and
autograd) which ``torch.compile`` and ``torch.export`` graphs call.

The pure-PyTorch path stays the reference and the fallback: it is used when
the kernel cannot be built (a warning, once), when ``ZMAT_NO_KERNEL=1``, for
other devices and dtypes, under ``torch.func`` transforms and forward-mode
AD, and for double backward (a backward with ``create_graph=True``
differentiates the torch path instead).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from . import _columns
from ._columns import ATOMS, POSITIONS, column
from ._segments import take_shift
from .table import ConstructionTable

_CSRC = Path(__file__).with_name("csrc")
# compiled into one library; headers hashed too
_SOURCES = ("rigid_forest.cpp", "torsions.cpp", "stamp.cpp", "internal.cpp", "move.cpp", "world.cpp")
_SOURCES += ("euler.cpp",)  # the flows' global tree rotations (zmat._kernel.euler)
_SOURCES += ("primitives.cpp",)  # the optimiser's coordinates (zmat/optimize/_compiled.py)
_SOURCES += ("fixed.cpp",)  # the flows' inverse with fixed atoms (zmat._kernel.fixed_inverse)
_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-pthread")
_DTYPES = (torch.float32, torch.float64)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
#: atoms of a call (structures x atoms) from which it splits over threads: below it, starting
#: threads costs more than it gains (a 16 x 256-residue backward, ~33k atoms, was twice as slow)
PARALLEL_ATOMS = 1 << 16
#: atoms per unit of work where a call on few structures splits their trees
CHUNK_ATOMS = 4096
_state: dict = {}  # "module": the loaded library (:class:`_Library`), or None where it failed


def disabled() -> bool:
    """Whether ``ZMAT_NO_KERNEL`` turns the kernel off (read at every call)."""
    return os.environ.get("ZMAT_NO_KERNEL", "") not in ("", "0")


# ------------------------------------------------------------------ build
def cache_dir() -> Path:
    """Where the compiled library is kept: ``$ZMAT_KERNEL_DIR``, else
    ``$XDG_CACHE_HOME/zmat``, else ``~/.cache/zmat``."""
    if os.environ.get("ZMAT_KERNEL_DIR"):
        return Path(os.environ["ZMAT_KERNEL_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zmat"


def _compiler() -> list[str] | None:
    """The compiler command (``$CXX``, else ``c++``), its binary resolved; None if not found."""
    cmd = shlex.split(os.environ.get("CXX") or "c++")
    exe = shutil.which(cmd[0]) if cmd else None
    return None if exe is None else [os.path.realpath(exe), *cmd[1:]]


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _source_key() -> str:
    """Hash of the sources and headers, the flags, the torch version and the machine."""
    files = sorted(_CSRC.glob("*.[ch]*"))
    return _digest(*(f.read_bytes() for f in files), *_FLAGS, torch.__version__, platform.machine())


def library_path(compiler: list[str] | None = None) -> Path:
    """The cached library for these sources and ``compiler`` (default: :func:`_compiler`).

    Without a compiler on this machine (an image built ahead), the newest
    library built from the same sources is used."""
    compiler = _compiler() if compiler is None else compiler
    source = _source_key()
    if compiler is None:
        built = sorted(cache_dir().glob(f"zmat_kernel-{source}-*.so"), key=lambda p: p.stat().st_mtime)
        if not built:
            raise RuntimeError("no C++ compiler found (set CXX) and no kernel built ahead")
        return built[-1]
    st = os.stat(compiler[0])
    return cache_dir() / f"zmat_kernel-{source}-{_digest(*compiler, st.st_size, st.st_mtime_ns)}.so"


def build(quiet: bool = False) -> Path:
    """Compile the kernel into :func:`cache_dir` unless it is there; returns its path.

    Safe from several processes at once: each compiles to a private file
    and renames it into place (atomic), so a reader sees no file or a whole one."""
    compiler = _compiler()
    path = library_path(compiler)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:  # one line: the estimate first (an idle machine), the measured time when done
        print(
            f"zmat: compiling the CPU kernel into {path} (once: ~7 s on an idle core, longer on a busy "
            "machine; `python -m zmat build-kernel` builds it ahead) ...",
            end="",
            file=sys.stderr,
            flush=True,
        )
    start = time.perf_counter()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        sources = [str(_CSRC / s) for s in _SOURCES]
        run = subprocess.run([*compiler, *_FLAGS, *sources, "-o", tmp], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(compiler)} failed:\n{run.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not quiet:
            print(f" {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return path


def load():
    """The compiled library (built on the first call, cached on disk), or
    ``None`` if it cannot be built (warned once; the torch path is used)."""
    if "module" not in _state:
        _state["module"] = None
        try:
            _state["module"] = _Library(ctypes.CDLL(str(build())))
        except Exception as error:  # no compiler, a read-only cache...
            warnings.warn(
                f"zmat: the compiled CPU kernel is unavailable ({type(error).__name__}: {error}); "
                "using the PyTorch path (set ZMAT_NO_KERNEL=1 to silence this)",
                RuntimeWarning,
                stacklevel=3,
            )
    return _state["module"]


def _loaded_constant() -> bool:
    """Whether the compiled graph may call the kernel's operators: Dynamo
    calls it for real while tracing (ctypes is never traced), as
    ``torch.compiler.assume_constant_result`` would mark it; that call imports
    torch._dynamo (seconds), so the mark is set here as ``zmat/table.py`` does."""
    return load() is not None


_loaded_constant._dynamo_marked_constant = True


def serves(device: torch.device) -> bool:
    """Whether float calls on ``device`` take the kernel (see :func:`usable`)."""
    if device.type != "cpu" or disabled():
        return False
    if torch.compiler.is_compiling():
        return _loaded_constant()
    return load() is not None


def usable(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may take the kernel: a plain CPU float32/float64
    tensor, outside ``torch.func`` transforms and forward-mode AD."""
    if x.dtype not in _DTYPES:
        return False
    if type(x) not in _PLAIN and not (torch.compiler.is_compiling() and type(x) is FakeTensor):
        return False  # (torch.export traces with fake tensors)
    if torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0:
        return False  # (dual tensors need the Functions' jvp)
    return serves(x.device)


def threads(structures: int, atoms: int) -> int:
    """Threads for a call on ``structures`` of ``atoms`` each: one below
    :data:`PARALLEL_ATOMS` in all, else ``torch.get_num_threads()``."""
    if structures * atoms < PARALLEL_ATOMS:
        return 1
    return torch.get_num_threads()


def split(structures: int, atoms: int):
    """``(threads, chunked)`` of a placement call: the structures are the units
    of work where there are enough of them, else also runs of whole trees
    (``chunked``: the plan's ``chunks``)."""
    n = threads(structures, atoms)
    return n, 1 < n and structures < 2 * n


def _chunks(parent: np.ndarray, roots: np.ndarray | None = None) -> np.ndarray:
    """Dfs positions ``0 ... N`` where runs of whole trees of about
    :data:`CHUNK_ATOMS` atoms start (a tree is contiguous in dfs order), from
    the ``parent`` of every position (and the ``roots``, positions of parent -1, if known)."""
    n = len(parent)
    roots = np.flatnonzero(parent < 0) if roots is None else roots
    bounds = tree_chunks(roots, n)
    if len(bounds) == 2:
        return bounds
    lowest = np.minimum.reduceat(np.where(parent < 0, n, parent), bounds[:-1])  # lowest parent per run
    if (lowest < bounds[:-1]).any():  # a tree across a boundary: no split
        return np.array([0, n], np.int64)
    return bounds


def tree_chunks(roots: np.ndarray, n: int) -> np.ndarray:
    """:func:`_chunks` of ``n`` positions whose trees are known to start at
    the sorted positions ``roots`` and to be contiguous (a builder's stamp):
    no pass over the parents."""
    if n < 2 * CHUNK_ATOMS or len(roots) < 2:
        return np.array([0, n], np.int64)
    first = np.searchsorted(roots, np.arange(0, n, CHUNK_ATOMS))  # first root from every multiple on
    return np.unique(np.concatenate([roots[np.minimum(first, len(roots) - 1)], [0, n]])).astype(np.int64)


# ------------------------------------------------------------------ the library
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {  # pointers and integers (sizes, element strides), see the C sources
    "forward": [_P, _I, _I, _I, "plan", _I, _P, _P, _I],
    "backward": [_P, _I, _I, _I, _I, _P, _I, _I, _I, _I, _P, _I, _I, _I, _P, _I, _I, _I]
    + [_I, "plan", _I, _I, _P, _I],
    "fill_forward": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _I],
    "fill_backward": [_P, _I, _I, _I, _P, _I, _I, _I, _I, _I, _I, _P, _P, _I],
    "torsions_forward": [_I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _P, _I],
    "torsions_backward": [_I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _P, _I, _I, _I, _P, _I],
    "internal_forward": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _I],
    "internal_backward": [_P, _I, _I, _I, _I, _I, _I, _P, _P, _P, _I, _I, _I, _P, _I],
    "carried_forward": [_P, _I, _I, _I, _I, _P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _I],
    "carried_backward": [_P, _I, _I, _I, _I, _P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I]
    + [_P, _P, _I],
    "global_forward": [_P, _I, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P]
    + [_P, _P, _P, _P, _I],
    "global_backward": [_P, _I, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P]
    + [_I, _I, _I, _P, _I],
    "move_forward": [_P, _I, _I, _I, _I, _P, _I, _I, _I, _P, _I, _I, _I, _P, _I, _I, _I, _I, _I]
    + [_P, _P, _P, _I],
    "move_backward": [_P, _I, _I, _I, _I, _P, _I, _I, _I, _P, _I, _I, _I, _I, _I, _I, _I, _P, _P]
    + [_P, _P, _P, _P, _I],
    "world_forward": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I],
    "world_backward": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I, _I, _I, _P, _I, _P, _I],
    "log_det": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _I, _P, _I],
    "fixed_inverse": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I],
    "pose_forward": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _I],
    "pose_backward": [_P, _I, _I, _I, _I, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _P, _I],
    "euler_forward": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I],
    "euler_backward": [_P, _I, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I]
    + [_P, _I],
}
_NO_STRIDES = (0, 0, 0, 0)


class _Arrays(ctypes.Structure):
    """A table's plan arrays as the C functions take them (``zmat_plan``): built
    once per plan, passed by pointer."""

    _fields_ = [(name, ctypes.c_int64) for name in ("n", "k_rows", "n_chunks")] + [
        (name, ctypes.c_void_p) for name in ("gather", "keep", "trig", "parent", "order", "chunks")
    ]
    # a joined plan (:class:`_JoinedPlan`): its pieces' _Arrays and first dfs positions
    _fields_ += [("n_pieces", ctypes.c_int64), ("pieces", ctypes.c_void_p), ("start", ctypes.c_void_p)]

    @classmethod
    def of(cls, gather: Tensor, keep: Tensor, trig: Tensor, parent: Tensor, order, chunks) -> _Arrays:
        """From contiguous CPU tensors (kept alive with it); ``order`` may be ``None``."""
        tensors = (gather, keep, trig, parent, order, chunks)
        ptrs = (None if t is None else t.data_ptr() for t in tensors)
        arrays = cls(parent.shape[0], gather.shape[0], chunks.shape[0] - 1, *ptrs)
        arrays.tensors = tensors
        return arrays


class _Library:
    """The C functions behind tensor-level calls: outputs allocated here
    (``new_empty``: the cheapest allocation from Python), inputs passed as
    pointers and element strides (any strides unless said; plan arrays
    contiguous). Lean on purpose: a batch-1 call is a few microseconds."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.fns = {}
        for name, args in _SIGNATURES.items():
            for suffix, dtype in (("f32", torch.float32), ("f64", torch.float64)):
                fn = getattr(lib, f"zmat_{name}_{suffix}")
                fn.argtypes = [ctypes.POINTER(_Arrays) if a == "plan" else a for a in args]
                fn.restype = None
                self.fns[name, dtype] = fn
        self.stamp = lib.zmat_stamp_plan
        self.stamp.argtypes = [_I, *[_P] * 11, _I, _I, _I, _P, _P]
        self.stamp.restype = None
        self.stamp_atoms = lib.zmat_stamp_atoms
        self.stamp_atoms.argtypes = [_I, *[_P] * 7, _I, _P, _P]
        self.stamp_atoms.restype = None

    def forward(self, c: Tensor, arrays: _Arrays, like=None, threads: int = 1, frames=True, chunked=False):
        """``c`` ``(B, 3N)`` -> ``(frames, xyz)``: frames ``(B, N, 3, 4)`` in dfs order
        (``None`` unless ``frames``) and, given ``like`` (a tensor of ``B * N * 3``
        elements, or a shape), positions in atom order shaped like it (else ``None``);
        ``chunked``: runs of whole trees (``arrays.chunks``) are units of work
        beside the structures."""
        b = c.shape[0]
        f = c.new_empty((b, arrays.n, 3, 4)) if frames else None
        xyz = None
        if isinstance(like, tuple):
            xyz = c.new_empty(like)
        elif like is not None:  # (empty_like: the cheapest allocation from Python)
            xyz = torch.empty_like(like) if like.is_contiguous() else like.new_empty(like.shape)
        self.fns["forward", c.dtype](
            c.data_ptr(), b, *c.stride(), arrays, chunked, None if f is None else f.data_ptr(),
            None if xyz is None else xyz.data_ptr(), threads,
        )  # fmt: skip
        return f, xyz

    def backward(self, frames, g_rot, g_pos, g_x, arrays: _Arrays, n3: int, threads: int = 1, chunked=False):
        """Gradient ``(B, n3)`` from the forward's frames ``(B, N, 3, 4)`` and the optional
        gradients of their rotations ``g_rot`` ``(B, N, 3, 3)`` and positions ``g_pos``
        ``(B, N, 3)`` (dfs order), and of positions ``g_x`` ``(B, N, 3)`` (atom order)."""
        b = frames.shape[0]
        grad = frames.new_empty((b, n3))
        self.fns["backward", frames.dtype](
            frames.data_ptr(), *frames.stride(),
            *((None, *_NO_STRIDES) if g_rot is None else (g_rot.data_ptr(), *g_rot.stride())),
            *((None, *_NO_STRIDES[:3]) if g_pos is None else (g_pos.data_ptr(), *g_pos.stride())),
            *((None, *_NO_STRIDES[:3]) if g_x is None else (g_x.data_ptr(), *g_x.stride())),
            b, arrays, chunked, n3, grad.data_ptr(), threads,
        )  # fmt: skip
        return grad

    def fill_forward(self, t: Tensor, ideal, slot, defaults):
        """Torsions ``(S, L, 7)`` -> internal coordinates ``(S, N, 3)`` (see :func:`fill`);
        ranges of atoms over :func:`threads`."""
        s, n = t.shape[0], slot.shape[0]
        out = t.new_empty((s, n, 3))
        self.fns["fill_forward", t.dtype](
            t.data_ptr(), *t.stride(), s, n, ideal.data_ptr(), slot.data_ptr(), defaults.data_ptr(),
            out.data_ptr(), threads(s, n),
        )  # fmt: skip
        return out

    def fill_backward(self, g: Tensor, t: Tensor, slot):
        """``g`` ``(S, N, 3)`` -> ``(S, L, 7)``, the gradient of :meth:`fill_forward`;
        ranges of torsions over :func:`threads` (each a sum in atom order: the
        same bits on any number of threads)."""
        s, n = t.shape[0], slot.shape[0]
        grad = g.new_empty(t.shape)
        self.fns["fill_backward", g.dtype](
            g.data_ptr(), *g.stride(), t.data_ptr(), *t.stride(), s, t.shape[1], n, slot.data_ptr(),
            grad.data_ptr(), threads(s, n),
        )  # fmt: skip
        return grad

    def torsions_forward(self, t: Tensor, col, parent, slot, t0, u, p, x0, threads: int = 1):
        """Torsions ``(B, K)`` -> positions ``(B, N, 3)`` (see :func:`torsions`)."""
        b, n = t.shape[0], slot.shape[0]
        xyz = t.new_empty((b, n, 3))
        self.fns["torsions_forward", t.dtype](
            col.shape[0], n, col.data_ptr(), parent.data_ptr(), slot.data_ptr(), t0.data_ptr(), u.data_ptr(),
            p.data_ptr(), x0.data_ptr(), t.data_ptr(), b, *t.stride(), xyz.data_ptr(), threads,
        )  # fmt: skip
        return xyz

    def torsions_backward(self, g: Tensor, t: Tensor, col, parent, slot, t0, u, p, x0, threads: int = 1):
        """``g`` ``(B, N, 3)`` -> ``(B, K)``, the gradient of :meth:`torsions_forward`."""
        b = t.shape[0]
        grad = t.new_empty((b, col.shape[0]))
        self.fns["torsions_backward", t.dtype](
            col.shape[0], slot.shape[0], col.data_ptr(), parent.data_ptr(), slot.data_ptr(), t0.data_ptr(),
            u.data_ptr(), p.data_ptr(), x0.data_ptr(), t.data_ptr(), b, *t.stride(), g.data_ptr(),
            *g.stride(), grad.data_ptr(), threads,
        )  # fmt: skip
        return grad

    def internal_forward(self, x: Tensor, path: Tensor, flags: Tensor) -> Tensor:
        """Positions ``x`` ``(B, K, 3)`` -> rows ``(B, M, 3)`` (see :func:`internal`)."""
        b, m = x.shape[0], flags.shape[0]
        out = x.new_empty((b, m, 3))
        self.fns["internal_forward", x.dtype](
            x.data_ptr(), b, *x.stride(), m, path.data_ptr(), flags.data_ptr(), out.data_ptr(), threads(b, m)
        )
        return out

    def internal_backward(self, x: Tensor, path: Tensor, flags: Tensor, g: Tensor) -> Tensor:
        """``g`` ``(B, M, 3)`` -> ``(B, K, 3)``, the gradient of :meth:`internal_forward`."""
        b, m = x.shape[0], flags.shape[0]
        grad = x.new_empty(x.shape)
        self.fns["internal_backward", x.dtype](
            x.data_ptr(), b, *x.stride(), x.shape[1], m, path.data_ptr(), flags.data_ptr(),
            g.data_ptr(), *g.stride(), grad.data_ptr(), threads(b, m),
        )  # fmt: skip
        return grad

    def pose_forward(self, x: Tensor, atoms: Tensor) -> tuple[Tensor, Tensor]:
        """Positions ``x`` ``(B, N, 3)`` -> the trees' axes ``(B, T, 3, 3)`` and charts ``(B, 3, T)``
        (see :func:`pose`)."""
        b, nt = x.shape[0], atoms.shape[0] // 3
        R, E = x.new_empty((b, nt, 3, 3)), x.new_empty((b, 3, nt))
        self.fns["pose_forward", x.dtype](
            x.data_ptr(), b, *x.stride(), nt, atoms.data_ptr(), R.data_ptr(), E.data_ptr(), threads(b, nt)
        )
        return R, E

    def pose_backward(self, x: Tensor, atoms: Tensor, gR: Tensor, gE: Tensor) -> Tensor:
        """The gradient ``(B, N, 3)`` of :meth:`pose_forward` at ``x`` for the cotangents ``gR``, ``gE``."""
        b, nt = x.shape[0], atoms.shape[0] // 3
        grad = x.new_empty((b, x.shape[1], 3))
        self.fns["pose_backward", x.dtype](
            x.data_ptr(), b, *x.stride(), x.shape[1], nt, atoms.data_ptr(),
            gR.data_ptr(), *gR.stride(), gE.data_ptr(), *gE.stride(), grad.data_ptr(), threads(b, nt),
        )  # fmt: skip
        return grad

    def euler_forward(self, q: Tensor, index: Tensor, chart: Tensor, scale, shift):
        """``q`` ``(B, N, 3)`` -> the trees' rotations ``(B, T, 3, 3)`` and origins ``(B, T, 3)``
        (see :func:`euler`)."""
        b, nt = q.shape[0], chart.shape[0]
        R, o = q.new_empty((b, nt, 3, 3)), q.new_empty((b, nt, 3))
        self.fns["euler_forward", q.dtype](
            q.data_ptr(), b, *q.stride(), nt, index.data_ptr(), chart.data_ptr(), _ptr(scale), _ptr(shift),
            R.data_ptr(), o.data_ptr(), threads(b, nt),
        )  # fmt: skip
        return R, o

    def euler_backward(self, q: Tensor, index: Tensor, chart: Tensor, scale, shift, gR, go) -> Tensor:
        """The gradient ``(B, N, 3)`` of :meth:`euler_forward` for ``gR``, ``go`` (either ``None``)."""
        b, nt = q.shape[0], chart.shape[0]
        gq = q.new_empty((b, q.shape[1], 3))
        self.fns["euler_backward", q.dtype](
            q.data_ptr(), b, *q.stride(), q.shape[1], nt, index.data_ptr(), chart.data_ptr(), _ptr(scale),
            _ptr(shift), _ptr(gR), *(_NO_STRIDES if gR is None else gR.stride()), _ptr(go),
            *(_NO_STRIDES[:3] if go is None else go.stride()), gq.data_ptr(), threads(b, nt),
        )  # fmt: skip
        return gq

    def _carried_args(self, x: Tensor, E: Tensor, k, flags: Tensor) -> tuple:
        n = x.shape[1]
        ptrs = (
            k.ab.data_ptr(),
            k.ref.data_ptr(),
            k.eslot.data_ptr(),
            k.mode.data_ptr(),
            flags.data_ptr(),
            k.order.data_ptr(),
        )
        return (x.data_ptr(), x.shape[0], *x.stride(), E.data_ptr(), *E.stride(), n, E.shape[1], *ptrs)

    def carried_forward(self, x: Tensor, E: Tensor, k, flags: Tensor) -> Tensor:
        """Rows ``(B, N, 3)`` against the carried axes (see :func:`carried`)."""
        out = x.new_empty(x.shape)
        fn = self.fns["carried_forward", x.dtype]
        fn(*self._carried_args(x, E, k, flags), out.data_ptr(), threads(x.shape[0], x.shape[1]))
        return out

    def carried_backward(self, x: Tensor, E: Tensor, k, flags: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        """``g`` ``(B, N, 3)`` -> the gradients of ``x`` and ``E`` of :meth:`carried_forward`."""
        gx, gE = x.new_empty(x.shape), E.new_empty(E.shape)
        fn = self.fns["carried_backward", x.dtype]
        args = (*g.stride(), gx.data_ptr(), gE.data_ptr(), threads(x.shape[0], x.shape[1]))
        fn(*self._carried_args(x, E, k, flags), g.data_ptr(), *args)
        return gx, gE

    def _global_args(self, x: Tensor, g) -> tuple:
        k = g.k
        rows = (k.ab, k.ref, k.eslot, k.mode, g.flags, k.order)
        trees = (g.atoms, g.z_frames, g.slots, g.orientation)
        head = (x.data_ptr(), x.shape[0], *x.stride(), x.shape[1], g.z_frames.shape[0])
        return (*head, *map(_ptr, rows), g.atoms.shape[0] // 3, *map(_ptr, trees), _ptr(g.scale))

    def global_forward(self, x: Tensor, g, grad: bool = False):
        """The flows' global inverse rows ``(B, N, 3)``, minus their log-determinants ``(B,)`` (in
        radians) and (``grad``, else ``None``) the gradient ``(B, N, 3)`` of those in the rows
        (radians; see :func:`global_inverse`)."""
        b, n = x.shape[:2]
        out, ld, gl = x.new_empty(x.shape), x.new_empty((b,)), x.new_empty(x.shape) if grad else None
        fn = self.fns["global_forward", x.dtype]
        logdet = (g.ld_weights.data_ptr(), ld.data_ptr(), _ptr(gl))
        fn(*self._global_args(x, g), _ptr(g.shift), out.data_ptr(), *logdet, threads(b, n))
        return out, ld, gl

    def global_backward(self, x: Tensor, g, grad: Tensor) -> Tensor:
        """The gradient ``(B, N, 3)`` of :meth:`global_forward` for ``grad`` (any strides)."""
        gx = x.new_empty(x.shape)
        fn = self.fns["global_backward", x.dtype]
        fn(*self._global_args(x, g), grad.data_ptr(), *grad.stride(), gx.data_ptr(), threads(*x.shape[:2]))
        return gx

    def move_forward(self, R: Tensor, o: Tensor, y: Tensor, c: Tensor, frame_of: Tensor, cartesian: Tensor):
        """``x`` ``(B, N, 3)`` (see :func:`move`)."""
        b, n = c.shape[0], c.shape[1]
        x = c.new_empty((b, n, 3))
        self.fns["move_forward", c.dtype](
            R.data_ptr(), *R.stride(), o.data_ptr(), *o.stride(), y.data_ptr(), *y.stride(), c.data_ptr(),
            *c.stride(), b, n, frame_of.data_ptr(), cartesian.data_ptr(), x.data_ptr(), threads(b, n),
        )  # fmt: skip
        return x

    def move_backward(self, R: Tensor, y: Tensor, g: Tensor, frame_of: Tensor, cartesian: Tensor):
        """``g`` ``(B, N, 3)`` -> the gradients of ``R``, ``o``, ``y``, ``c`` of :meth:`move_forward`."""
        b, n = g.shape[0], g.shape[1]
        gR, go = R.new_empty(R.shape), R.new_empty(R.shape[:-1])
        gy, gc = y.new_empty(y.shape), g.new_empty(g.shape)
        self.fns["move_backward", g.dtype](
            R.data_ptr(), *R.stride(), y.data_ptr(), *y.stride(), g.data_ptr(), *g.stride(), b, n,
            R.shape[1], y.shape[1], frame_of.data_ptr(), cartesian.data_ptr(), gR.data_ptr(),
            go.data_ptr(), gy.data_ptr(), gc.data_ptr(), threads(b, n),
        )  # fmt: skip
        return gR, go, gy, gc

    def world_forward(self, q: Tensor, plan: Tensor, kind: Tensor, scale, shift, log_det: bool = True):
        """``q`` ``(B, N, 3)`` -> positions ``(B, N, 3)`` and log-determinants ``(B,)`` (``None``
        unless ``log_det``; see :func:`world`)."""
        b, n = q.shape[0], kind.shape[0]
        x, ld = q.new_empty((b, n, 3)), q.new_empty((b,)) if log_det else None
        self.fns["world_forward", q.dtype](
            q.data_ptr(), b, *q.stride(), n, plan.data_ptr(), kind.data_ptr(), _ptr(scale), _ptr(shift),
            x.data_ptr(), _ptr(ld), threads(b, n),
        )  # fmt: skip
        return x, ld

    def world_backward(
        self, q: Tensor, plan: Tensor, kind: Tensor, scale, shift, x: Tensor, gx, gld
    ) -> Tensor:
        """The gradient ``(B, N, 3)`` of ``q`` from those of :meth:`world_forward` (either ``None``)."""
        b, n = q.shape[0], kind.shape[0]
        gq = q.new_empty((b, n, 3))
        self.fns["world_backward", q.dtype](
            q.data_ptr(), b, *q.stride(), n, plan.data_ptr(), kind.data_ptr(), _ptr(scale), _ptr(shift),
            x.data_ptr(), _ptr(gx), *(_NO_STRIDES[:3] if gx is None else gx.stride()), _ptr(gld),
            0 if gld is None else gld.stride(0), gq.data_ptr(), threads(b, n),
        )  # fmt: skip
        return gq

    def log_det(self, q: Tensor, weights: Tensor, scale, shift, gld=None) -> Tensor:
        """``q`` ``(B, N, 3)`` -> the log-determinants ``(B,)``, or given their gradient ``gld``
        ``(B,)``, the gradient ``(B, N, 3)`` of ``q`` (see :func:`log_det`)."""
        b, n = q.shape[0], weights.shape[0] // 2
        out = q.new_empty((b,) if gld is None else (b, n, 3))
        ld, gq = (out, None) if gld is None else (None, out)
        self.fns["log_det", q.dtype](
            q.data_ptr(), b, *q.stride(), n, weights.data_ptr(), _ptr(scale), _ptr(shift), _ptr(ld),
            _ptr(gld), 0 if gld is None else gld.stride(0), _ptr(gq), threads(b, n),
        )  # fmt: skip
        return out

    # the flows' inverse with fixed atoms: q flat (B, 3 M), as the flows give it (no views per call)
    def fixed_inverse(self, x: Tensor, path: Tensor, flags: Tensor, weights: Tensor, grad: bool = False):
        """Positions ``x`` ``(B, K, 3)`` -> rows ``(B, 3 M)``, minus their log-determinants ``(B,)``
        and (``grad``, else ``None``) the gradient ``(B, 3 M)`` of those in the rows (see
        :func:`fixed_inverse`)."""
        b, m = x.shape[0], flags.shape[0]
        out, ld, gl = x.new_empty((b, 3 * m)), x.new_empty((b,)), x.new_empty((b, 3 * m)) if grad else None
        self.fns["fixed_inverse", x.dtype](
            x.data_ptr(), b, *x.stride(), m, path.data_ptr(), flags.data_ptr(), weights.data_ptr(),
            out.data_ptr(), ld.data_ptr(), _ptr(gl), threads(b, m),
        )  # fmt: skip
        return out, ld, gl

    def fixed_inverse_backward(self, x: Tensor, path: Tensor, flags: Tensor, g: Tensor) -> Tensor:
        """:meth:`internal_backward` of rows ``g`` ``(B, 3 M)``."""
        b, m, (g0, g1) = x.shape[0], flags.shape[0], g.stride()
        grad = x.new_empty(x.shape)
        self.fns["internal_backward", x.dtype](
            x.data_ptr(), b, *x.stride(), x.shape[1], m, path.data_ptr(), flags.data_ptr(),
            g.data_ptr(), g0, 3 * g1, g1, grad.data_ptr(), threads(b, m),
        )  # fmt: skip
        return grad


def _ptr(t: Tensor | None):
    return None if t is None else t.data_ptr()


def stamp_plan(
    units: tuple, pieces: tuple, n: int, k: int, n_threads: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """A protein batch's :class:`KernelPlan` ``(ints, flags)``, stamped in C
    (``zmat/csrc/stamp.cpp``; ``zmat.protein.pieces.kernel_arrays`` is the
    reference), or None unless the library is loaded (a kernel call loads
    it; the torch path reading the table's depth-first order never builds it).

    Args:
        units: ``(piece, size, atom0, last)`` int64 arrays, one value per unit.
        pieces: per piece ``head``, ``start``, ``prev_rank``; per piece atom
            ``seq``, ``parent_where``, ``link`` (int64) and ``flags`` (uint64).
        n: atoms; k: gather rows (3 or 4).
        n_threads: threads, runs of whole trees each (default :func:`threads`
            of the atoms); the same bits on any count.
    """
    out = (np.empty((k + 2, n), np.int64), np.empty((k + 2, n), np.uint8))
    if not _stamp("stamp", (*units, *pieces), (n, k, _stamp_threads(n, n_threads)), out):
        return None
    return out[0], out[1].view(bool)


def stamp_atoms(
    units: tuple, pieces: tuple, n: int, n_threads: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """A protein batch's ``ideal`` ``(N, 3)`` and ``torsion_slot`` ``(N,)``
    stamped in C (``zmat.protein.pieces.batch_arrays`` is the reference), or
    None unless the library is loaded (as :func:`stamp_plan`).

    Args:
        units: ``(piece, size, atom0, pad7)`` int64, one value per unit.
        pieces: ``start`` per piece; ``ideal`` float64 ``(atoms, 3)`` and the
            torsion ``code`` int64 per piece atom.
        n_threads: as :func:`stamp_plan`'s.
    """
    out = (np.empty((n, 3)), np.empty(n, np.int64))
    return out if _stamp("stamp_atoms", (*units, *pieces), (_stamp_threads(n, n_threads),), out) else None


def _stamp_threads(n: int, n_threads: int | None) -> int:
    return threads(1, n) if n_threads is None else n_threads


def _stamp(name: str, inputs: tuple, sizes: tuple, out: tuple) -> bool:
    """Call the loaded library's stamp function ``name`` on ``inputs`` (the
    first holds one value per unit), ``sizes`` and ``out``; False unless loaded."""
    lib = _state.get("module")
    if lib is None or disabled():
        return False
    arrays = [np.ascontiguousarray(a) for a in inputs]
    getattr(lib, name)(
        len(arrays[0]), *(a.ctypes.data for a in arrays), *sizes, *(o.ctypes.data for o in out)
    )
    return True


def _lib() -> _Library:
    module = _state.get("module")
    return module if module is not None else load()


# ------------------------------------------------------------------ operators
# The kernel as torch.library operators, for torch.compile / torch.export
# graphs (an eager call takes the Functions further below: a custom op's
# dispatch costs more than the kernel on a small molecule).
@torch.library.custom_op("zmat::place", mutates_args=())
def _op_place(
    c: Tensor, gather: Tensor, keep: Tensor, trig: Tensor, parent: Tensor, chunks: Tensor, order: Tensor
) -> tuple[Tensor, Tensor]:
    """``c`` ``(B, 3N)`` -> frames ``(B, N, 3, 4)`` (dfs order), positions ``(B, N, 3)`` (atom order)."""
    b, n = c.shape[0], parent.shape[0]
    arrays = _Arrays.of(gather, keep, trig, parent, order, chunks)
    threads_, chunked = split(b, n)
    return _lib().forward(c, arrays, (b, n, 3), threads_, True, chunked)


@torch.library.custom_op("zmat::frames", mutates_args=())
def _op_frames(
    c: Tensor, gather: Tensor, keep: Tensor, trig: Tensor, parent: Tensor, chunks: Tensor
) -> Tensor:
    """``c`` ``(B, 3N)`` -> frames ``(B, N, 3, 4)`` in dfs order."""
    n, chunked = split(c.shape[0], parent.shape[0])
    arrays = _Arrays.of(gather, keep, trig, parent, None, chunks)
    return _lib().forward(c, arrays, None, n, True, chunked)[0]


@torch.library.custom_op("zmat::place_backward", mutates_args=())
def _op_place_backward(
    frames: Tensor, g_rot: Tensor | None, g_pos: Tensor | None, g_x: Tensor | None, order: Tensor | None,
    gather: Tensor, keep: Tensor, parent: Tensor, chunks: Tensor, n3: int,
) -> Tensor:  # fmt: skip
    """The gradient ``(B, n3)`` of ``c`` (see :meth:`_Library.backward`; ``g_x`` needs ``order``)."""
    n, chunked = split(frames.shape[0], parent.shape[0])
    arrays = _Arrays.of(gather, keep, keep, parent, order, chunks)  # (no trig in the backward)
    return _lib().backward(frames, g_rot, g_pos, g_x, arrays, n3, n, chunked)


@torch.library.custom_op("zmat::fill", mutates_args=())
def _op_fill(t: Tensor, ideal: Tensor, slot: Tensor, defaults: Tensor) -> Tensor:
    """Torsions ``(S, L, 7)`` -> internal coordinates ``(S, N, 3)`` (see :func:`fill`)."""
    return _lib().fill_forward(t, ideal, slot, defaults)


@torch.library.custom_op("zmat::fill_backward", mutates_args=())
def _op_fill_backward(g: Tensor, t: Tensor, slot: Tensor) -> Tensor:
    return _lib().fill_backward(g, t, slot)


@torch.library.custom_op("zmat::torsions", mutates_args=())
def _op_torsions(
    t: Tensor, col: Tensor, parent: Tensor, slot: Tensor, t0: Tensor, u: Tensor, p: Tensor, x0: Tensor
) -> Tensor:
    """Torsions ``(B, K)`` -> positions ``(B, N, 3)`` (see :func:`torsions`)."""
    return _lib().torsions_forward(t, col, parent, slot, t0, u, p, x0, threads(t.shape[0], slot.shape[0]))


@torch.library.custom_op("zmat::torsions_backward", mutates_args=())
def _op_torsions_backward(
    g: Tensor,
    t: Tensor,
    col: Tensor,
    parent: Tensor,
    slot: Tensor,
    t0: Tensor,
    u: Tensor,
    p: Tensor,
    x0: Tensor,
) -> Tensor:
    b, n = t.shape[0], slot.shape[0]
    return _lib().torsions_backward(g, t, col, parent, slot, t0, u, p, x0, threads(b, n))


@_op_place.register_fake
def _(c, gather, keep, trig, parent, chunks, order):
    b, n = c.shape[0], parent.shape[0]
    return c.new_empty((b, n, 3, 4)), c.new_empty((b, n, 3))


@_op_frames.register_fake
def _(c, gather, keep, trig, parent, chunks):
    return c.new_empty((c.shape[0], parent.shape[0], 3, 4))


@_op_place_backward.register_fake
def _(frames, g_rot, g_pos, g_x, order, gather, keep, parent, chunks, n3):
    return frames.new_empty((frames.shape[0], n3))


@_op_fill.register_fake
def _(t, ideal, slot, defaults):
    return t.new_empty((t.shape[0], slot.shape[0], 3))


@_op_fill_backward.register_fake
def _(g, t, slot):
    return g.new_empty(t.shape)


@_op_torsions.register_fake
def _(t, col, parent, slot, t0, u, p, x0):
    return t.new_empty((t.shape[0], slot.shape[0], 3))


@_op_torsions_backward.register_fake
def _(g, t, col, parent, slot, t0, u, p, x0):
    return t.new_empty((t.shape[0], col.shape[0]))


def _place_setup(ctx, inputs, output):
    c, gather, keep, _, parent, chunks, order = inputs
    ctx.n3 = c.shape[1]
    ctx.save_for_backward(output[0], gather, keep, parent, chunks, order)


def _place_bwd(ctx, g_frames, g_xyz):
    frames, gather, keep, parent, chunks, order = ctx.saved_tensors
    g_rot = g_pos = None
    if g_frames is not None:
        g_rot, g_pos = g_frames[..., :3], g_frames[..., 3]
    args = (g_rot, g_pos, g_xyz, order, gather, keep, parent, chunks, ctx.n3)
    return torch.ops.zmat.place_backward(frames, *args), None, None, None, None, None, None


def _frames_setup(ctx, inputs, output):
    c, gather, keep, _, parent, chunks = inputs
    ctx.n3 = c.shape[1]
    ctx.save_for_backward(output, gather, keep, parent, chunks)


def _frames_bwd(ctx, g_frames):
    frames, gather, keep, parent, chunks = ctx.saved_tensors
    g_rot, g_pos = g_frames[..., :3], g_frames[..., 3]
    args = (g_rot, g_pos, None, None, gather, keep, parent, chunks, ctx.n3)
    return torch.ops.zmat.place_backward(frames, *args), None, None, None, None, None


def _fill_setup(ctx, inputs, output):
    t, _, slot, _ = inputs
    ctx.save_for_backward(t, slot)


def _fill_bwd(ctx, g):
    t, slot = ctx.saved_tensors
    return torch.ops.zmat.fill_backward(g, t, slot), None, None, None


def _torsions_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _torsions_bwd(ctx, g):
    saved = ctx.saved_tensors
    return torch.ops.zmat.torsions_backward(g, *saved), *([None] * 7)


_op_place.register_autograd(_place_bwd, setup_context=_place_setup)
_op_frames.register_autograd(_frames_bwd, setup_context=_frames_setup)
_op_fill.register_autograd(_fill_bwd, setup_context=_fill_setup)
_op_torsions.register_autograd(_torsions_bwd, setup_context=_torsions_setup)


# ------------------------------------------------------------ protein fill
def fill(t: torch.Tensor, ideal: torch.Tensor, slot: torch.Tensor, defaults: torch.Tensor) -> torch.Tensor:
    """Torsions ``(S, L, 7)`` -> internal coordinates ``(S, N, 3)`` of a
    protein layout: ``zmat.protein.build.fill_internal`` without ``base`` in
    one loop (its ~30 elementwise ops each enter a parallel region on a batch,
    and wait there for a busy core). Calls of :data:`PARALLEL_ATOMS` atoms or
    more split it over :func:`threads`: ranges of atoms forward, ranges of
    torsions backward (each gradient entry summed in atom order by one
    thread: the same bits on any number of threads).

    Args:
        t: ``(S, L, 7)`` float32/float64 CPU torsions (any strides).
        ideal: ``(N, 3)`` float64 ideal values (NaN: 0).
        slot: ``(N,)`` int64 torsion slot ``k * 7 + c`` of each atom, -1 for none.
        defaults: ``(7,)`` float64 torsions used where ``t`` is NaN.
    """
    if torch.compiler.is_compiling():
        return torch.ops.zmat.fill(t, ideal, slot, defaults)
    if torch.is_grad_enabled() and t.requires_grad:
        return _Fill.apply(t, ideal, slot, defaults)
    return _state["module"].fill_forward(t, ideal, slot, defaults)


def fill_vjp(g: torch.Tensor, t: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`fill` in differentiable torch ops (for double
    backward and batched gradients): ``g`` ``(S, N, 3)`` -> ``(S, L, 7)``."""
    index = slot.clamp_min(0)
    keep = (slot >= 0) & ~torch.isnan(t.flatten(1).index_select(1, index))
    g_phi = torch.where(keep, g[..., 2], 0)
    return torch.zeros_like(t).flatten(1).index_add(1, index, g_phi).view_as(t)


class _Fill(torch.autograd.Function):
    """The ctx form, as the placement Functions below (why: see there)."""

    @staticmethod
    def forward(ctx, t, ideal, slot, defaults):
        ctx.slot = slot
        ctx.save_for_backward(t)
        ctx.set_materialize_grads(False)
        return _state["module"].fill_forward(t, ideal, slot, defaults)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None, None
        (t,) = ctx.saved_tensors
        if _differentiable_backward(g):
            return fill_vjp(g, t.detach(), ctx.slot), None, None, None
        return _state["module"].fill_backward(g, t, ctx.slot), None, None, None


# ------------------------------------------------------------ torsion updates
def torsions(t: torch.Tensor, plan: tuple, vjp) -> torch.Tensor:
    """Torsions ``(B, K)`` -> positions ``(B, N, 3)`` of rigid torsion updates
    (``zmat/csrc/torsions.cpp``: Rodrigues rotations about the conformer's
    bond axes composed from the root outwards, every atom moved by its
    innermost torsion's motion).

    Args:
        t: ``(B, K)`` float32/float64 CPU torsions (any strides).
        plan: ``(col, parent, slot, t0, u, p, x0)``: in nesting order (parents
            first) every torsion's column of ``t``, parent (-1: none), value
            in the conformer ``t0`` and unit axis ``u`` ``(K, 3)`` through ``p``
            ``(K, 3)``; per atom its torsion (index into that order, -1: none)
            ``slot`` ``(N,)`` and conformer position ``x0`` ``(N, 3)``; indices
            int64, geometry float64, contiguous.
        vjp: ``(t, g) -> (B, K)`` the gradient in differentiable torch ops
            (double backward, batched gradients).
    """
    if torch.compiler.is_compiling():
        return torch.ops.zmat.torsions(t, *plan)
    if torch.is_grad_enabled() and t.requires_grad:
        return _Torsions.apply(t, plan, vjp)
    return _state["module"].torsions_forward(t, *plan, threads(t.shape[0], plan[2].shape[0]))


class _Torsions(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, plan, vjp):
        ctx.plan, ctx.vjp = plan, vjp
        ctx.save_for_backward(t)
        ctx.set_materialize_grads(False)
        return _state["module"].torsions_forward(t, *plan, threads(t.shape[0], plan[2].shape[0]))

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None
        (t,) = ctx.saved_tensors
        if _differentiable_backward(g):
            return ctx.vjp(t, g), None, None
        n = ctx.plan[2].shape[0]
        return _state["module"].torsions_backward(g, t, *ctx.plan, threads(t.shape[0], n)), None, None


# ------------------------------------------------------------ internal coordinates of rows
def internal(x: torch.Tensor, path: torch.Tensor, flags: torch.Tensor, reference) -> torch.Tensor:
    """Rows ``(r, theta, phi)`` ``(B, M, 3)`` from positions ``x`` ``(B, K, 3)``
    (``zmat/csrc/internal.cpp``): the flows' inverse (``zmat.flows._internal``'s
    formulas and degenerate values) in one loop, with its exact gradient. Eager
    CPU float calls only (:func:`usable`, not while compiling: the caller takes
    ``reference`` then).

    Args:
        x: ``(B, K, 3)`` float32/float64 CPU positions (any strides).
        path: ``(4 M,)`` int64 contiguous, the atoms ``d, a, b, i`` of every row, block by block.
        flags: ``(M,)`` uint8 contiguous: bit 0, 1, 2 the entries ``r, theta, phi`` the row
            uses (the others are 0), bit 3 the row is the position of ``i`` itself.
        reference: ``x -> (B, M, 3)`` in differentiable torch ops, for double backward.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _Internal.apply(x, path, flags, reference)
    return _state["module"].internal_forward(x, path, flags)


class _Internal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, path, flags, reference):
        ctx.path, ctx.flags, ctx.reference = path, flags, reference
        ctx.save_for_backward(x)
        ctx.set_materialize_grads(False)
        return _state["module"].internal_forward(x, path, flags)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None, None
        (x,) = ctx.saved_tensors
        if _differentiable_backward(g):  # the reference's gradient, itself differentiable
            return torch.autograd.grad(ctx.reference(x), x, g, create_graph=True)[0], None, None, None
        return _state["module"].internal_backward(x, ctx.path, ctx.flags, g), None, None, None


def carried(x: torch.Tensor, E: torch.Tensor, k, flags: torch.Tensor, reference) -> torch.Tensor:
    """A table's rows ``(B, N, 3)`` from positions ``x`` ``(B, N, 3)``, every dihedral against the
    axis ``to_xyz`` carries through straight angles (``zmat/csrc/internal.cpp``;
    ``zmat._carried.internal_coordinates`` is the reference), with the exact gradient.
    Eager CPU float calls only (as :func:`internal`).

    Args:
        x: positions (any strides); E: ``(B, L, 3)`` the fixed axes that end the chains
            (``zmat._carried.end_axes``, any strides, the dtype of ``x``).
        k: ``zmat._carried.CarriedKernel``; flags: ``(N,)`` uint8 as for :func:`internal`.
        reference: ``(x, E) -> (B, N, 3)`` in differentiable torch ops, for double backward.
    """
    if torch.is_grad_enabled() and (x.requires_grad or E.requires_grad):
        return _Carried.apply(x, E, k, flags, reference)
    return _state["module"].carried_forward(x, E, k, flags)


class _Carried(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, E, k, flags, reference):
        ctx.k, ctx.flags, ctx.reference = k, flags, reference
        ctx.save_for_backward(x, E)
        ctx.set_materialize_grads(False)
        return _state["module"].carried_forward(x, E, k, flags)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return (None,) * 5
        x, E = ctx.saved_tensors
        if _differentiable_backward(g):  # the reference's gradient, itself differentiable
            wanted = [v for v in (x, E) if v.requires_grad]
            grads = iter(
                torch.autograd.grad(ctx.reference(x, E), wanted, g, create_graph=True, allow_unused=True)
            )
            return *(next(grads) if v.requires_grad else None for v in (x, E)), None, None, None
        return *_state["module"].carried_backward(x, E, ctx.k, ctx.flags, g), None, None, None


def pose(x: torch.Tensor, atoms: torch.Tensor, reference):
    """The flows' tree poses from positions ``x`` ``(B, N, 3)`` (``zmat/csrc/internal.cpp``;
    ``zmat.flows._tree_pose_torch`` is the reference): the axes ``(B, T, 3, 3)`` (columns) and
    ``(alpha, cos beta, gamma)`` ``(B, 3, T)`` of every tree, in one loop, with its exact
    gradient (the reference's under double backward). Eager CPU float calls only (as :func:`internal`).

    Args:
        x: positions (any strides); atoms: ``(3 T,)`` int64 contiguous, the roots, second and
            third atoms of the trees, block by block.
        reference: ``x -> (R, E)`` in differentiable torch ops.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _Pose.apply(x, atoms, reference)
    return _state["module"].pose_forward(x, atoms)


class _Pose(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, atoms, reference):
        ctx.atoms, ctx.reference = atoms, reference
        ctx.save_for_backward(x)
        ctx.set_materialize_grads(False)
        return _state["module"].pose_forward(x, atoms)

    @staticmethod
    def backward(ctx, gR, gE):
        if gR is None and gE is None:
            return None, None, None
        (x,) = ctx.saved_tensors
        if _differentiable_backward(*(g for g in (gR, gE) if g is not None)):  # the reference's gradient
            outs = [(o, g) for o, g in zip(ctx.reference(x), (gR, gE), strict=True) if g is not None]
            grad = torch.autograd.grad([o for o, _ in outs], x, [g for _, g in outs], create_graph=True)[0]
            return grad, None, None
        b, nt = x.shape[0], ctx.atoms.shape[0] // 3
        gR = x.new_zeros((b, nt, 3, 3)) if gR is None else gR
        gE = x.new_zeros((b, 3, nt)) if gE is None else gE
        return _state["module"].pose_backward(x, ctx.atoms, gR, gE), None, None


def euler(q: torch.Tensor, index: torch.Tensor, chart: torch.Tensor, scale, shift, reference):
    """The free trees' rotations ``(B, T, 3, 3)`` and origins ``(B, T, 3)`` of the flows' global
    forward from ``q`` ``(B, N, 3)`` (any strides), the chart's clamp and the angles' scale folded
    in (``zmat/csrc/euler.cpp``; ``zmat.flows._tree_frames_torch`` is the reference), with the
    exact gradient (the reference's under double backward). Eager CPU float calls only (as
    :func:`internal`).

    Args:
        index: ``(6 T,)`` int64, per tree the flat ``(N, 3)`` entries of its root's position,
            alpha, gamma and cos beta; chart: ``(T,)`` uint8, 1 where cos beta is clamped.
        scale, shift: ``(N, 3)`` contiguous in ``q``'s dtype, or ``None``.
        reference: ``q -> (R, o)`` in differentiable torch ops.
    """
    if torch.is_grad_enabled() and q.requires_grad:
        return _Euler.apply(q, index, chart, scale, shift, reference)
    return _state["module"].euler_forward(q, index, chart, scale, shift)


class _Euler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, index, chart, scale, shift, reference):
        ctx.arrays, ctx.reference = (index, chart, scale, shift), reference
        ctx.save_for_backward(q)
        ctx.set_materialize_grads(False)
        return _state["module"].euler_forward(q, index, chart, scale, shift)

    @staticmethod
    def backward(ctx, gR, go):
        if gR is None and go is None:
            return (None,) * 6
        (q,) = ctx.saved_tensors
        if _differentiable_backward(*(g for g in (gR, go) if g is not None)):  # the reference's gradient
            outs = [(o, g) for o, g in zip(ctx.reference(q), (gR, go), strict=True) if g is not None]
            grad = torch.autograd.grad([o for o, _ in outs], q, [g for _, g in outs], create_graph=True)[0]
            return grad, None, None, None, None, None
        return _state["module"].euler_backward(q, *ctx.arrays, gR, go), None, None, None, None, None


@dataclass(frozen=True)
class GlobalPlan:
    """The arrays of :func:`global_inverse`, contiguous: ``k`` ``zmat._carried.CarriedKernel``,
    ``flags`` ``(N,)`` uint8 as for :func:`internal`; ``atoms`` ``(3 T,)`` as for :func:`pose`;
    ``z_frames`` ``(L,)`` int64 the tree of each chain end; ``slots`` ``(3 T,)`` int64 the flat
    ``(N, 3)`` entry each of the trees' ``(alpha, cos beta, gamma)`` (block by block) goes to, -1
    none; ``orientation`` ``(N, 3)`` bool, those entries; ``scale``, ``shift`` ``(N, 3)`` (the rows
    are ``(q - shift) / scale``) or ``None``; ``ld_weights`` ``(2 N,)`` :func:`log_det`'s weights."""

    k: object
    flags: torch.Tensor
    atoms: torch.Tensor
    z_frames: torch.Tensor
    slots: torch.Tensor
    orientation: torch.Tensor
    scale: torch.Tensor | None
    shift: torch.Tensor | None
    ld_weights: torch.Tensor


def global_inverse(x: torch.Tensor, plan: GlobalPlan, reference):
    """The flows' global inverse rows ``(B, N, 3)`` from positions ``x`` ``(B, N, 3)`` (any
    strides) in one compiled call per direction (``zmat/csrc/internal.cpp``, ``global_forward``
    and ``global_backward``): the trees' poses (:func:`pose`), the carried rows against their axes
    (:func:`carried`, the chains ending on ``+z`` of their tree only), the trees' orientations in
    their slots and the normalisation, with the same values and sums as those calls apart; and in
    the same pass minus the rows' log-determinant ``(B,)`` (as :func:`fixed_inverse`'s: in
    radians, the caller subtracts the normalisation's constant) and, where ``x`` requires grad,
    its gradient ``(B, N, 3)`` in the rows (radians; else ``None``), neither differentiable (for
    :func:`inverse_log_det`). Eager CPU float calls only (as :func:`internal`).

    Args:
        plan: :class:`GlobalPlan`.
        reference: ``x -> (B, N, 3)`` differentiable, for double backward.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        module = _state["module"]
        return _InverseWithLogDet.apply(
            x,
            lambda x: module.global_forward(x, plan, True),
            lambda x, g: module.global_backward(x, plan, g),
            reference,
        )
    return _state["module"].global_forward(x, plan)


class _InverseWithLogDet(torch.autograd.Function):
    """``(q, ld, gl) = run(x)``, the flows' compiled inverses (:func:`global_inverse`,
    :func:`fixed_inverse`): ``q`` differentiable through ``grad_of(x, g)``, or through
    ``reference`` where the backward itself must be differentiable; ``ld``, ``gl`` not."""

    @staticmethod
    def forward(ctx, x, run, grad_of, reference):
        ctx.grad_of, ctx.reference = grad_of, reference
        ctx.save_for_backward(x)
        ctx.set_materialize_grads(False)
        q, ld, gl = run(x)
        ctx.mark_non_differentiable(ld, gl)
        return q, ld, gl

    @staticmethod
    def backward(ctx, g, _, __):
        if g is None:
            return None, None, None, None
        (x,) = ctx.saved_tensors
        if _differentiable_backward(g):  # the reference's gradient, itself differentiable
            return torch.autograd.grad(ctx.reference(x), x, g, create_graph=True)[0], None, None, None
        return ctx.grad_of(x, g), None, None, None


def move(R, o, y, c, frame_of: torch.Tensor, cartesian: torch.Tensor, reference) -> torch.Tensor:
    """``x_i = o_f + R_f y_i`` (``f = frame_of[i]``), or ``c_i`` where ``cartesian[i]``
    (``zmat/csrc/move.cpp``): the flows' rigid motions in one pass, with the exact gradient.
    Eager CPU float calls only (as :func:`internal`).

    Args:
        R: ``(B, F, 3, 3)`` rotations; o: ``(B, F, 3)`` origins; y: ``(B, M, 3)``, ``M >= N``,
            positions in the frames (the first ``N`` read); c: ``(B, N, 3)`` the Cartesian
            atoms' positions (any strides; one float dtype).
        frame_of: ``(N,)`` int64, cartesian: ``(N,)`` uint8, contiguous.
        reference: ``(R, o, y, c) -> (B, N, 3)`` in differentiable torch ops, for double backward.
    """
    if torch.is_grad_enabled() and any(v.requires_grad for v in (R, o, y, c)):
        return _Move.apply(R, o, y, c, frame_of, cartesian, reference)
    return _state["module"].move_forward(R, o, y, c, frame_of, cartesian)


class _Move(torch.autograd.Function):
    @staticmethod
    def forward(ctx, R, o, y, c, frame_of, cartesian, reference):
        ctx.frame_of, ctx.cartesian, ctx.reference = frame_of, cartesian, reference
        ctx.save_for_backward(R, o, y, c)
        ctx.set_materialize_grads(False)
        return _state["module"].move_forward(R, o, y, c, frame_of, cartesian)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return (None,) * 7
        inputs = ctx.saved_tensors
        if _differentiable_backward(g):  # the reference's gradient, itself differentiable
            wanted = [v for v in inputs if v.requires_grad]
            out = ctx.reference(*inputs)
            grads = iter(torch.autograd.grad(out, wanted, g, create_graph=True, allow_unused=True))
            return *(next(grads) if v.requires_grad else None for v in inputs), None, None, None
        R, _, y, _ = inputs
        return *_state["module"].move_backward(R, y, g, ctx.frame_of, ctx.cartesian), None, None, None


def world(q: torch.Tensor, plan: torch.Tensor, kind: torch.Tensor, scale, shift, reference):
    """Positions ``(B, N, 3)`` and the log-determinant ``(B,)`` of the flows' forward with fixed
    atoms, every atom placed in world coordinates in one pass (``zmat/csrc/world.cpp``), with the
    exact gradient. Eager CPU float calls only (as :func:`internal`).

    Args:
        q: ``(B, N, 3)`` (any strides): positions, or ``(r, theta, phi)``, ``(r, cos beta,
            alpha)``, ``(r, theta, gamma)`` (see ``world.cpp``).
        plan: ``(4, N)`` int64 contiguous, per placement position the atom, ``b``, ``a``, ``d``;
            kind: ``(N,)`` uint8, each position's kind (``world.cpp``'s ``CART`` ... ``NERF``).
        scale, shift: ``(N, 3)`` contiguous in ``q``'s dtype (angles are ``q * scale + shift``), or ``None``.
        reference: ``q -> (x, log_det)`` in differentiable torch ops, for double backward.
    """
    if torch.is_grad_enabled() and q.requires_grad:
        return _World.apply(q, plan, kind, scale, shift, reference)
    return _state["module"].world_forward(q, plan, kind, scale, shift)


class _World(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, plan, kind, scale, shift, reference):
        ctx.arrays, ctx.reference = (plan, kind, scale, shift), reference
        x, ld = _state["module"].world_forward(q, plan, kind, scale, shift)
        ctx.save_for_backward(q, x)
        ctx.set_materialize_grads(False)
        return x, ld

    @staticmethod
    def backward(ctx, gx, gld):
        if gx is None and gld is None:
            return (None,) * 6
        q, x = ctx.saved_tensors
        if _differentiable_backward(*(g for g in (gx, gld) if g is not None)):  # the reference's gradient
            outs = [(o, g) for o, g in zip(ctx.reference(q), (gx, gld), strict=True) if g is not None]
            grad = torch.autograd.grad([o for o, _ in outs], q, [g for _, g in outs], create_graph=True)[0]
            return grad, None, None, None, None, None
        return _state["module"].world_backward(q, *ctx.arrays, x, gx, gld), None, None, None, None, None


def log_det(q: torch.Tensor, weights: torch.Tensor, scale, shift, reference) -> torch.Tensor:
    """``sum_i w_i log|r_i| + w'_i log|sin theta_i|`` ``(B,)`` of ``q`` ``(B, N, 3)`` (any strides;
    ``r, theta = q * scale + shift``), each floored as ``zmat.flows._log_det`` (``zmat/csrc/world.cpp``),
    with the exact gradient. Eager CPU float calls only (as :func:`internal`).

    Args:
        weights: ``(2 N,)`` contiguous in ``q``'s dtype, ``(w_0, w'_0, w_1, ...)`` (0: not read).
        scale, shift: ``(N, 3)`` contiguous, or ``None``.
        reference: ``q -> (B,)`` in differentiable torch ops, for double backward.
    """
    if torch.is_grad_enabled() and q.requires_grad:
        return _LogDet.apply(q, weights, scale, shift, reference)
    return _state["module"].log_det(q, weights, scale, shift)


class _LogDet(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, weights, scale, shift, reference):
        ctx.arrays, ctx.reference = (weights, scale, shift), reference
        ctx.save_for_backward(q)
        ctx.set_materialize_grads(False)
        return _state["module"].log_det(q, weights, scale, shift)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return (None,) * 5
        (q,) = ctx.saved_tensors
        if _differentiable_backward(g):  # the reference's gradient, itself differentiable
            return torch.autograd.grad(ctx.reference(q), q, g, create_graph=True)[0], None, None, None, None
        return _state["module"].log_det(q, *ctx.arrays, g), None, None, None, None


# ------------------------------------------------------------ the flows' inverse with fixed atoms
# Batch-1 calls are dispatch-bound: one tensor argument per Function (the plan arrays in a tuple),
# no views where the batch is one dimension.
def fixed_inverse(x: torch.Tensor, arrays: tuple, reference):
    """Rows ``(..., 3 M)`` (flat, as the flows' ``q``), minus their log-determinant ``(...)`` and,
    where ``x`` requires grad, its gradient ``(..., 3 M)`` in the rows (else ``None``; the last
    two not differentiable: :func:`inverse_log_det` makes the log-det a function of the rows)
    from positions ``x`` ``(..., K, 3)`` (``zmat/csrc/fixed.cpp``: :func:`internal`'s rows and, in
    the same pass, :func:`log_det` of them to rounding, ``sin theta`` from the geometry), with the
    rows' exact gradient. Eager CPU float calls only (as :func:`internal`).

    Args:
        arrays: ``(path, flags, weights)``: :func:`internal`'s ``path`` and ``flags``,
            :func:`log_det`'s ``weights`` ``(2 M,)``.
        reference: ``x -> (..., 3 M)`` in differentiable torch ops, for double backward.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _InverseWithLogDet.apply(
            x,
            lambda x: _fixed_inverse(x, arrays, True),
            lambda x, g: _fixed_inverse_backward(x, arrays[:2], g),
            reference,
        )
    return _fixed_inverse(x, arrays, False)


def _fixed_inverse(x, arrays, grad):
    if x.dim() == 3:
        return _state["module"].fixed_inverse(x, *arrays, grad)
    batch = x.shape[:-2]
    q, ld, gl = _state["module"].fixed_inverse(x.reshape(-1, *x.shape[-2:]), *arrays, grad)
    return q.view(*batch, -1), ld.view(batch), None if gl is None else gl.view(*batch, -1)


def _fixed_inverse_backward(x, arrays, g):
    if x.dim() == 3:
        return _state["module"].fixed_inverse_backward(x, *arrays, g)
    x3 = x.reshape(-1, *x.shape[-2:])
    grad = _state["module"].fixed_inverse_backward(x3, *arrays, g.reshape(x3.shape[0], -1))
    return grad.view(x.shape)


def inverse_log_det(q: torch.Tensor, value: torch.Tensor, grad, reference):
    """``value`` ``(...)``, minus the log-determinant of ``q`` ``(..., 3 N)`` as computed by
    :func:`fixed_inverse`, differentiable in ``q``: its gradient ``grad`` ``(..., 3 N)`` (from
    :func:`fixed_inverse` too, scaled to ``q``; given where ``q`` requires grad), times the
    incoming one (no second pass over ``q``). Eager CPU float calls only; ``value`` is handed
    out once (it becomes the output).

    Args:
        reference: ``q -> (...)`` in differentiable torch ops, for double backward.
    """
    if torch.is_grad_enabled() and q.requires_grad:
        return _InverseLogDet.apply(q, (value, grad), reference)
    return value


class _InverseLogDet(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, value_grad, reference):
        ctx.grad, ctx.reference = value_grad[1], reference
        ctx.save_for_backward(q)
        ctx.set_materialize_grads(False)
        return value_grad[0]  # not an input: no view of it

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None
        if _differentiable_backward(g):  # the reference's gradient, itself differentiable
            (q,) = ctx.saved_tensors
            return torch.autograd.grad(ctx.reference(q), q, g, create_graph=True)[0], None, None
        return ctx.grad * (g if g.numel() == 1 else g.unsqueeze(-1)), None, None  # (one op at batch 1)


class KernelPlan:
    """The plan arrays the kernel reads, in depth-first order, for one table.

    Args:
        ints: ``(K + 2, N)`` int64: ``gather`` ``(K, N)``, the flat index into
            ``C`` of every atom's ``(r, theta, phi, phi of its offset
            chain...)`` entries; then every atom's parent (dfs position, -1
            none) and its atom index (``order``).
        flags: ``(K + 2, N)`` bool: ``keep`` ``(K, N)``, which of those
            entries the table uses; then whether theta and phi are used
            (``trig``; else pi, 0).
        vjp: ``(table, rot, pos, g_rot, g_pos) -> flat gradient (3 N, B)`` in
            differentiable torch ops (``_vjp`` of ``zmat/_analytic.py``), for
            double backward and batched gradients; it plans the torch path
            only when such a backward happens.
        chunks: :func:`_chunks` of the parents, if made already (a batch
            prepared in a ``DataLoader`` worker).
        roots: the dfs positions whose parent is -1, if known (a builder's stamp).
    """

    def __init__(self, ints: np.ndarray, flags: np.ndarray, vjp, chunks=None, roots=None) -> None:
        self._ints, self._flags, self.vjp = ints, flags.view(np.uint8), vjp
        k = len(ints) - 2
        self.roots = np.flatnonzero(ints[k] < 0) if roots is None else roots
        self.n = ints.shape[1]
        self.gather, self.parent, self.order = (torch.from_numpy(a) for a in (ints[:k], ints[k], ints[k + 1]))
        self.keep, self.trig = torch.from_numpy(self._flags[:k]), torch.from_numpy(self._flags[k:])
        self.placement = (self.gather, self.keep, self.trig, self.parent)  # the forward's arrays
        # units of work for threads: runs of whole trees, for tables rooted at
        # the origin (positions): there a tree's gathers stay in the tree, while
        # an anchored segment (frames) may read a sibling's phi in another
        self.chunks = torch.from_numpy(_chunks(ints[k], self.roots) if chunks is None else chunks)
        self.whole = torch.tensor([0, self.n])  # one unit per structure

    @functools.cached_property
    def arrays(self) -> _Arrays:
        """The arrays as the C functions take them (made on the first eager call:
        a plan made under ``torch.export``'s fake tensors has no data)."""
        return _Arrays.of(*self.placement, self.order, self.chunks)

    @functools.cached_property
    def _packed(self) -> np.ndarray:
        """``ints`` packed (:func:`zmat._columns.encode`), for :meth:`take` and :meth:`concatenate`."""
        return _columns.encode(KernelArrays, self._ints)

    def take(self, ptr: np.ndarray, index: np.ndarray) -> KernelPlan:
        """The plan of ``ConstructionTable.take(ptr, index)``'s table: component
        ``k`` of the table is atoms and dfs positions ``ptr[k]:ptr[k + 1]``, so
        its columns move together (:func:`zmat._columns.taken`)."""
        _, shift = take_shift(ptr, index)
        ints = _columns.decode(KernelArrays, _columns.taken(KernelArrays, self._packed, ptr, index, shift))
        return KernelPlan(ints, _columns.taken(KernelFlags, self._flags, ptr, index, shift), self.vjp)

    @staticmethod
    def concatenate(plans: list[KernelPlan]) -> KernelPlan:
        """The plan of ``ConstructionTable.concatenate`` of the plans' tables:
        their columns side by side, indices shifted by each table's first atom.
        The kernel reads the pieces' arrays in place (:class:`_JoinedPlan`), so
        a fresh batch of tables planned once writes no plan."""
        return _JoinedPlan(plans)


def _copied(plans: tuple, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``(ints, flags)`` of the plans side by side: the arrays
    :func:`zmat._columns.joined` of their packed plans decodes to (a narrower
    offset chain's rows: entry 0, unused), each plan's columns written once,
    shifted as they are copied; ``roots``: the joined roots."""
    k = max(len(p._ints) for p in plans) - 2
    n = sum(p.n for p in plans)
    ints, flags = np.zeros((k + 2, n), np.int64), np.zeros((k + 2, n), np.uint8)
    at = 0
    for p in plans:
        kp, end = len(p._ints) - 2, at + p.n
        np.add(p._ints[:kp], 3 * at, out=ints[:kp, at:end])  # gather: flat into C, 3 per atom
        np.add(p._ints[kp], at, out=ints[k, at:end])  # dfs positions (the roots' -1: set back below)
        np.add(p._ints[kp + 1], at, out=ints[k + 1, at:end])  # atom of every position
        flags[:kp, at:end], flags[k:, at:end] = p._flags[:kp], p._flags[kp:]
        at = end
    ints[k, roots] = -1
    return ints, flags


class _JoinedPlan(KernelPlan):
    """:meth:`KernelPlan.concatenate`'s plan: the kernel reads its pieces' own
    arrays, each with the offset of its first atom (``zmat_plan``'s pieces in
    ``zmat/csrc/rigid_forest.cpp``), and the thread chunks are the pieces'
    chunks, offset (no run of trees spans two pieces). The joined arrays
    (:func:`_copied`), which ``torch.compile``'s operators, :meth:`take` and a
    double backward read, are written only when first read."""

    def __init__(self, plans: list[KernelPlan]) -> None:
        self.pieces = tuple(q for p in plans for q in getattr(p, "pieces", (p,)))  # (a batch of batches)
        self.vjp = plans[0].vjp
        self.start = np.zeros(len(self.pieces) + 1, np.int64)
        np.cumsum([p.n for p in self.pieces], out=self.start[1:])
        self.n = int(self.start[-1])
        bounds = [p.chunks.numpy() + at for p, at in zip(self.pieces, self.start, strict=False)]
        self.chunks = torch.from_numpy(np.unique(np.concatenate(bounds)))
        self.whole = torch.tensor([0, self.n])

    @functools.cached_property
    def roots(self) -> np.ndarray:
        return np.concatenate([p.roots + at for p, at in zip(self.pieces, self.start, strict=False)])

    @functools.cached_property
    def _joined(self) -> tuple[np.ndarray, np.ndarray]:
        return _copied(self.pieces, self.roots)

    _ints = property(lambda self: self._joined[0])
    _flags = property(lambda self: self._joined[1])

    @functools.cached_property
    def placement(self) -> tuple[Tensor, ...]:
        ints, flags = (torch.from_numpy(a) for a in self._joined)
        k = len(ints) - 2
        return ints[:k], flags[:k], flags[k:], ints[k]

    gather = property(lambda self: self.placement[0])
    keep = property(lambda self: self.placement[1])
    trig = property(lambda self: self.placement[2])
    parent = property(lambda self: self.placement[3])
    order = property(lambda self: torch.from_numpy(self._ints[-1]))

    @functools.cached_property
    def arrays(self) -> _Arrays:
        pieces = (_Arrays * len(self.pieces))(*(p.arrays for p in self.pieces))
        start = torch.from_numpy(self.start)
        chunks = (self.chunks.data_ptr(), len(self.pieces), ctypes.addressof(pieces), start.data_ptr())
        arrays = _Arrays(self.n, 0, len(self.chunks) - 1, None, None, None, None, None, *chunks)
        arrays.tensors = (pieces, start, self.chunks, self.pieces)  # (kept alive with it)
        return arrays


@dataclass(frozen=True)
class KernelArrays:
    """The int64 rows of a :class:`KernelPlan` (its ``ints``, packed in this
    order), each declaring what its values index (:mod:`zmat._columns`)."""

    gather: np.ndarray = column(ATOMS, None, scale=3, none="clip", by_rows=True)  # (K, N) flat into C
    parent: np.ndarray = column(POSITIONS)  # (N,), -1: none
    order: np.ndarray = column(ATOMS)  # (N,) atom of every dfs position


@dataclass(frozen=True)
class KernelFlags:
    """The bool rows of a :class:`KernelPlan` (its ``flags``): they index nothing."""

    keep: np.ndarray = column(None, None, by_rows=True, dtype=bool)  # (K, N): entries used
    trig: np.ndarray = column(None, 2, by_rows=True, dtype=bool)  # (2, N): theta, phi used


def _differentiable_backward(*grads) -> bool:
    """A backward with ``create_graph=True`` or under ``vmap`` (batched
    gradients, e.g. gradcheck's) differentiates the torch path instead of
    calling the kernel, which needs plain tensors."""
    if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
        return True
    functorch = torch._C._functorch
    return any(
        g is not None and (functorch.is_legacy_batchedtensor(g) or functorch.is_functorch_wrapped_tensor(g))
        for g in grads
    )


# The Functions below use the ctx form of ``forward``, not ``setup_context``:
# ``Function.apply`` binds a ``setup_context`` Function's arguments with
# ``inspect.signature`` (~8 us, more than the kernel on a small molecule), and
# the kernel is never used under ``torch.func`` transforms, which would need it.


def positions(C: torch.Tensor, plan: KernelPlan, table: ConstructionTable) -> torch.Tensor:
    """Positions ``(..., N, 3)`` in atom order from internal coordinates ``C``
    ``(..., N, 3)``, for tables whose segments are all rooted at the origin
    (``table.constant_anchors``)."""
    if torch.compiler.is_compiling():
        c = C.reshape(-1, 3 * plan.n)
        return torch.ops.zmat.place(c, *plan.placement, plan.chunks, plan.order)[1].view(C.shape)
    if torch.is_grad_enabled() and C.requires_grad:
        return _Positions.apply(C, plan, table)[0]
    return _place(C, plan, False)[1]  # no graph: no Function, no frames


def frames(flat: torch.Tensor, plan: KernelPlan, table: ConstructionTable):
    """Flat internal coordinates ``(3 N, B)`` -> frames relative to their
    segment anchors, component-major, dfs order: rotations ``(3, 3, N, B)``,
    positions ``(3, N, B)`` (as ``RigidForest`` in ``zmat/_analytic.py``)."""
    if torch.compiler.is_compiling():
        return _split(torch.ops.zmat.frames(flat.t(), *plan.placement, plan.whole))
    return _Frames.apply(flat, plan, table)


def _place(C: torch.Tensor, plan: KernelPlan, frames: bool = True):
    """Frames ``(B, N, 3, 4)`` in dfs order (``None`` unless ``frames``) and
    positions ``(..., N, 3)`` (``C``'s shape) in atom order."""
    c = C.reshape(-1, 3 * plan.n)
    n, chunked = split(c.shape[0], plan.n)
    return _state["module"].forward(c, plan.arrays, C, n, frames, chunked)


def _split(frames: torch.Tensor):
    """``(B, N, 3, 4)`` -> rotations ``(3, 3, N, B)``, positions ``(3, N, B)``
    (component-major views, the layout of ``RigidForest``)."""
    frames = frames.permute(2, 3, 1, 0)
    return frames[:, :3], frames[:, 3]


def _backward(ctx, frames, g_rot, g_pos, g_x=None, saved=None) -> torch.Tensor:
    """Gradient ``(B, 3 N)`` of the flat internal coordinates from the saved
    ``frames`` ``(B, N, 3, 4)`` and the output gradients: of the rotations
    and positions (component-major, ``(3, 3, N, B)``, ``(3, N, B)``) and of
    the positions in atom order ``g_x`` ``(..., N, 3)``. A backward that
    must be differentiable takes the torch ``vjp`` (through the frames, which
    are outputs of the Functions below: so double backward differentiates
    it, as ``RigidForest``'s; ``saved``: the saved ``(rot, pos)`` outputs, if
    the Function's outputs are those)."""
    plan = ctx.plan
    if g_x is not None:
        g_x = g_x.reshape(-1, plan.n, 3)
    if _differentiable_backward(g_rot, g_pos, g_x):
        if g_x is not None:
            g_dfs = g_x.index_select(1, plan.order).permute(2, 1, 0)
            g_pos = g_dfs if g_pos is None else g_pos + g_dfs
        return plan.vjp(ctx.table, *(saved or _split(frames)), g_rot, g_pos).t()
    g_rot = None if g_rot is None else g_rot.permute(3, 2, 0, 1)
    g_pos = None if g_pos is None else g_pos.permute(2, 1, 0)
    n, chunked = split(frames.shape[0], plan.n)
    chunked = chunked and saved is None  # (trees of anchored segments may share gathers)
    return _state["module"].backward(frames, g_rot, g_pos, g_x, plan.arrays, 3 * plan.n, n, chunked)


class _Positions(torch.autograd.Function):
    """``C -> (positions (..., N, 3) in atom order, frames (B, N, 3, 4))``;
    the frames are an output only for the backward (``positions`` returns the first)."""

    @staticmethod
    def forward(ctx, C: torch.Tensor, plan: KernelPlan, table: ConstructionTable):
        frames, xyz = _place(C, plan)
        ctx.plan, ctx.table, ctx.shape = plan, table, C.shape
        ctx.save_for_backward(frames)
        ctx.set_materialize_grads(False)
        return xyz, frames

    @staticmethod
    def backward(ctx, g_xyz, g_frames):
        if g_xyz is None and g_frames is None:
            return None, None, None
        (frames,) = ctx.saved_tensors
        g_rot, g_pos = (None, None) if g_frames is None else _split(g_frames)
        return _backward(ctx, frames, g_rot, g_pos, g_xyz).reshape(ctx.shape), None, None


class _Frames(torch.autograd.Function):
    """``flat (3 N, B) -> (rot (3, 3, N, B), pos (3, N, B))``, views of the kernel's frames."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, plan: KernelPlan, table: ConstructionTable):
        n = threads(flat.shape[1], plan.n)  # structures only (see KernelPlan.chunks)
        frames, _ = _state["module"].forward(flat.t(), plan.arrays, None, n, True, False)
        rot, pos = _split(frames)
        ctx.plan, ctx.table, ctx.frames = plan, table, frames
        ctx.save_for_backward(rot, pos)  # outputs (double backward differentiates through them)
        ctx.set_materialize_grads(False)
        return rot, pos

    @staticmethod
    def backward(ctx, g_rot, g_pos):
        if g_rot is None and g_pos is None:
            return None, None, None
        return _backward(ctx, ctx.frames, g_rot, g_pos, saved=ctx.saved_tensors).t(), None, None
