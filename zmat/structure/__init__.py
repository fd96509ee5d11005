"""All-atom structures: nucleotides (DNA, RNA), hydrogens, ligands, and the
:class:`~zmat.structure.complex.Complex` that ``zmat.protein.from_pdb`` returns for them.

The residue templates of every type (the 20 amino acids' slot arrays included, which
``Protein``'s layout stamps) are compiled in :mod:`zmat.structure.templates`. Proteins' own
rooms (amino-acid topology and ideal geometry, layouts, the stamped ``ProteinBatch``,
AlphaFold's tensors, frames and violation losses) live in :mod:`zmat.protein`;
the public names of both are exported from :mod:`zmat.protein`
(``docs/allatom.md``).

Modules, each importing only those above it: ``ccd`` (CCD entries), ``nucleic``,
``sugar``, ``nucleic_ideal``, ``nucleic_frames`` (RhoFold's nucleotide frames and atoms from
frames + torsions), ``hydrogens``, ``ligands``, ``amino_ideal`` <- ``allatom``
(parsing, the tree) <- ``complex_batch`` <- ``complex``.
"""

# The structure modules build on zmat.protein's modules, and zmat.protein (the public facade
# of both) re-exports theirs; so zmat.protein is made first, whichever module is imported first
# (``import zmat.structure.complex`` in a fresh interpreter failed with a partial module).
from .. import protein  # noqa: E402, F401
