"""Proteins: residue topology, PDB/mmCIF I/O, and torsion-space building.

* :func:`from_pdb` reads a PDB or mmCIF file into a :class:`Protein` (heavy
  atoms of the standard residues, a construction table over them, internal
  coordinates, torsions, radii and covalent bonds for clash losses) that
  ``.to_pdb`` writes back.
* :func:`layout_of` / :func:`protein_layout`: the :class:`Layout` (atoms,
  construction rows, torsion bookkeeping) of residues or of a sequence.
* :func:`internal_from_torsions`, :func:`to_xyz_from_torsions` and
  :class:`ProteinBatch` turn torsions (phi, psi, omega, chi1..chi4) and ideal
  geometry into coordinates, differentiably, for one sequence or a padded
  batch of different lengths (``ProteinBatch.from_proteins``: with the
  proteins' torsions); ``Protein.xyz_from_torsions`` keeps a structure's own
  geometry and changes only its torsions. Proline rings are closed in every
  such path (``docs/proteins.md``).
* AlphaFold's tensors: ``Protein.to_atom37`` / ``to_atom14`` / ``aatype``,
  :func:`from_atom37`, :func:`from_atom14` (:mod:`zmat.protein.atom37`);
  backbone frames and atoms from frames + torsions (:mod:`zmat.protein.frames`);
  nucleotides' frames and atoms from frames + torsions, RhoFold's convention
  (:mod:`zmat.structure.nucleic_frames`);
  :func:`structural_violations` (:mod:`zmat.protein.violations`).
* :func:`internal_from_six_angles` / :func:`six_angles_from_backbone`:
  FoldingDiff's six-angle backbone.
* All-atom structures (``docs/allatom.md``): DNA/RNA, hydrogens
  (``hydrogens=``, :class:`Protonation`) and ligands (``ligands=``) make
  ``from_pdb`` return a :class:`Complex` (one tree over every kept atom,
  nucleotide torsions and sugar puckers in ``torsions``, ligand torsions,
  ``ideal_internal`` from torsions and puckers); :class:`ComplexBatch` batches
  them. Their modules live in :mod:`zmat.structure` (``zmat.protein.ccd`` and
  the other old paths still import).

Conventions: Angstrom, radians, IUPAC dihedral signs; torsion columns in
``TORSION_NAMES`` order; templates and ideal geometry in
:mod:`zmat.protein.topology`.

Modules, each importing only those above it: ``topology`` (residue
templates) <- ``zmat.structure.templates`` (the types compiled to slots, shared
with the all-atom path) <- ``layout`` (atoms and rows of a chain) <- ``build`` (torsions
-> coordinates, ``ProteinBatch``) <- ``structure`` (``Protein``); ``io``
(PDB / mmCIF files, plain data) sits beside ``build`` and is used by
``structure``.
"""

import sys

from ..structure import (
    allatom,
    amino_ideal,
    ccd,
    complex,
    complex_batch,
    hydrogens,
    ligands,
    nucleic,
    nucleic_ideal,
    sugar,
)
from ..structure.complex import TORSION_KEYS, Complex
from ..structure.complex_batch import ComplexBatch
from ..structure.hydrogens import Protonation
from ..structure.nucleic_frames import (
    nucleotide_atoms_from_frames,
    nucleotide_frames,
    nucleotide_positions,
    nucleotide_torsions,
)
from ..transform import dihedrals
from .atom37 import atom14_alt_positions, atom14_to_atom37, atom37_to_atom14, compute_renamed_ground_truth
from .atom37_io import from_atom14, from_atom37
from .build import (
    DEFAULT_TORSIONS,
    FOLDINGDIFF_ANGLES,
    FOLDINGDIFF_LENGTHS,
    ProteinBatch,
    backbone_table,
    fill_internal,
    internal_from_six_angles,
    internal_from_torsions,
    protein_layout,
    six_angles_from_backbone,
    to_xyz_from_torsions,
)
from .frames import (
    apply_frames,
    atom14_from_frames,
    atom37_from_frames,
    backbone_frames,
    backbone_frames_from_torsions,
    rigid_from_three_points,
)
from .layout import Layout, layout_of
from .structure import Protein, from_pdb, from_structure
from .topology import CHI_ATOMS, RESIDUES, TORSION_NAMES, ResidueTemplate, one_to_three
from .violations import clash_pairs, structural_violations

# The all-atom modules moved to zmat.structure; their old paths stay importable.
for _module in (
    allatom,
    amino_ideal,
    ccd,
    complex,
    complex_batch,
    hydrogens,
    ligands,
    nucleic,
    nucleic_ideal,
    sugar,
):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module

__all__ = [
    "apply_frames",
    "atom14_from_frames",
    "atom37_from_frames",
    "backbone_frames",
    "backbone_frames_from_torsions",
    "clash_pairs",
    "nucleotide_atoms_from_frames",
    "nucleotide_frames",
    "nucleotide_positions",
    "nucleotide_torsions",
    "rigid_from_three_points",
    "structural_violations",
    "atom14_alt_positions",
    "atom14_to_atom37",
    "atom37_to_atom14",
    "compute_renamed_ground_truth",
    "from_atom14",
    "from_atom37",
    "CHI_ATOMS",
    "Complex",
    "ComplexBatch",
    "Protonation",
    "TORSION_KEYS",
    "DEFAULT_TORSIONS",
    "FOLDINGDIFF_ANGLES",
    "FOLDINGDIFF_LENGTHS",
    "Layout",
    "Protein",
    "ProteinBatch",
    "RESIDUES",
    "ResidueTemplate",
    "TORSION_NAMES",
    "backbone_table",
    "dihedrals",
    "fill_internal",
    "from_pdb",
    "from_structure",
    "internal_from_six_angles",
    "internal_from_torsions",
    "layout_of",
    "one_to_three",
    "protein_layout",
    "six_angles_from_backbone",
    "to_xyz_from_torsions",
]
