"""All-atom structures: nucleotides (DNA, RNA), hydrogens, ligands, and the
:class:`~zmat.structure.complex.Complex` that ``zmat.protein.from_pdb`` returns for them.

Proteins' own rooms (residue templates of the 20 amino acids, layouts, the stamped
``ProteinBatch``, AlphaFold's tensors, frames and violation losses) live in
:mod:`zmat.protein`; the public names of both are exported from :mod:`zmat.protein`
(``docs/allatom.md``).

Modules, each importing only those above it: ``ccd`` (CCD entries), ``nucleic``,
``sugar``, ``nucleic_ideal``, ``nucleic_frames`` (RhoFold's nucleotide frames and atoms from
frames + torsions), ``hydrogens``, ``ligands``, ``amino_ideal`` <- ``allatom``
(parsing, the tree) <- ``complex_batch`` <- ``complex``.
"""
