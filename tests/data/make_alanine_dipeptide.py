"""Make the short alanine-dipeptide trajectory in tests/data (run once; the output is committed).

    python tests/data/make_alanine_dipeptide.py

Writes ``alanine_dipeptide.pdb`` (topology with CONECT records for every bond)
and ``alanine_dipeptide.dcd`` (the trajectory, Angstrom, float32).

How it is made (origin notes also in SOURCES.md):

1. Heavy atoms: residue ALA 28 of ubiquitin (tests/data/1ubi.pdb, wwPDB, CC0)
   with the backbone atoms of its neighbours as caps: ACE = CA, C, O of
   LYS 27 (as CH3, C, O), NME = N, CA of LYS 29 (as N, CH3).
2. Hydrogens: ``openmm.app.Modeller.addHydrogens`` (pH 7) with the Amber14
   force field bundled in the OpenMM wheel (``amber14-all.xml``, ff14SB).
3. Dynamics: ff14SB with OBC2 implicit solvent (``implicit/obc2.xml``), no
   cutoff, no constraints (the flow example models the bond lengths too),
   Langevin middle integrator, 300 K, friction 1/ps, 1 fs step; energy
   minimisation, 20 ps equilibration, then 1000 frames, one every 1 ps
   (1 ns), on OpenMM's CPU platform with a fixed random seed.
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
N_FRAMES = 1000
STRIDE = 1000  # steps of 1 fs between frames
EQUIL = 20_000
SEED = 2024


def capped_alanine(pdb_path: Path):
    """Heavy atoms of ACE-ALA-NME taken from ubiquitin residues 27-29 (see the module docstring)."""
    from openmm import app, unit

    src = app.PDBFile(str(pdb_path))
    want = {(27, "CA"): ("ACE", "CH3"), (27, "C"): ("ACE", "C"), (27, "O"): ("ACE", "O")}
    want.update({(28, n): ("ALA", n) for n in ("N", "CA", "C", "O", "CB")})
    want.update({(29, "N"): ("NME", "N"), (29, "CA"): ("NME", "C")})
    xyz = src.getPositions(asNumpy=True).value_in_unit(unit.nanometer)
    found = {}
    for atom in src.topology.atoms():
        key = (int(atom.residue.id), atom.name)
        if atom.residue.chain.id == "A" and key in want:
            found[want[key]] = (atom.element, xyz[atom.index])
    top = app.Topology()
    chain = top.addChain("A")
    pos = []
    residues = (("ACE", ("CH3", "C", "O")), ("ALA", ("N", "CA", "C", "O", "CB")), ("NME", ("N", "C")))
    for resname, names in residues:
        res = top.addResidue(resname, chain)
        for name in names:
            element, p = found[(resname, name)]
            top.addAtom(name, element, res)
            pos.append(p)
    top.createStandardBonds()
    return top, np.asarray(pos) * unit.nanometer


def main() -> None:
    import openmm
    from openmm import app, unit

    top, pos = capped_alanine(HERE / "1ubi.pdb")
    ff = app.ForceField("amber14-all.xml", "implicit/obc2.xml")
    model = app.Modeller(top, pos)
    model.addHydrogens(ff, pH=7.0)
    system = ff.createSystem(model.topology, nonbondedMethod=app.NoCutoff, constraints=None)
    integrator = openmm.LangevinMiddleIntegrator(300 * unit.kelvin, 1 / unit.picosecond, 1 * unit.femtosecond)
    integrator.setRandomNumberSeed(SEED)
    platform = openmm.Platform.getPlatformByName("CPU")
    sim = app.Simulation(model.topology, system, integrator, platform, {"Threads": "1"})
    sim.context.setPositions(model.positions)
    sim.minimizeEnergy()
    sim.context.setVelocitiesToTemperature(300 * unit.kelvin, SEED)
    sim.step(EQUIL)

    with open(HERE / "alanine_dipeptide_openmm.pdb", "w") as fh:  # OpenMM's names, temporary
        state = sim.context.getState(getPositions=True)
        app.PDBFile.writeFile(model.topology, state.getPositions(), fh)
    sim.reporters.append(app.DCDReporter(str(HERE / "alanine_dipeptide.dcd"), STRIDE))
    sim.step(N_FRAMES * STRIDE)
    write_topology(model.topology, HERE / "alanine_dipeptide_openmm.pdb", HERE / "alanine_dipeptide.pdb")
    (HERE / "alanine_dipeptide_openmm.pdb").unlink()


def write_topology(top, tmp_pdb: Path, out: Path) -> None:
    """The PDB again through MDAnalysis, with a CONECT record for every bond of the OpenMM topology
    (OpenMM writes CONECT only for non-standard residues), so readers get the force field's bonds."""
    import MDAnalysis as mda

    u = mda.Universe(str(tmp_pdb))
    u.add_TopologyAttr("bonds", [(a.index, b.index) for a, b in top.bonds()])
    u.atoms.write(str(out), bonds="all")
    # no periodic box: drop the placeholder CRYST1 MDAnalysis writes, and its remarks
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(x for x in lines if not x.startswith(("CRYST1", "REMARK     285"))))


if __name__ == "__main__":
    main()
