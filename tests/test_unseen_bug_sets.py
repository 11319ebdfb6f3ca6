"""The sets of planted bugs written apart from the simulator since set F (``support.unseen_bugs_f``,
``unseen_bugs_g``, ``unseen_bugs_h``) can be planted as written.

Why it exists: a planted bug whose text the product no longer holds, or holds twice, would
plant nothing or something else, and the share the bench measures over the set would count a
bug that is not there. These tests prove that every bug of each set plants once into a copy
of the package (each old text found exactly once in its file), that the copy still imports
(the bug is a wrong behaviour, not a syntax error), and that its name is its own: unique in the
set and in no other set, so the bench's table never merges two bugs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.planted_bugs import BUGS, PACKAGE, Planted, planted
from support.unseen_bugs import UNSEEN
from support.unseen_bugs_b import UNSEEN_B
from support.unseen_bugs_c import UNSEEN_C
from support.unseen_bugs_d import UNSEEN_D
from support.unseen_bugs_e import UNSEEN_E
from support.unseen_bugs_f import UNSEEN_F
from support.unseen_bugs_g import UNSEEN_G
from support.unseen_bugs_h import UNSEEN_H

#: The sets checked here, by their letter (bench/unseen_bugs.py --set), and every set of bugs.
CHECKED: dict[str, tuple[Planted, ...]] = {"F": UNSEEN_F, "G": UNSEEN_G, "H": UNSEEN_H}
ALL_SETS: tuple[tuple[Planted, ...], ...] = (
    BUGS,
    UNSEEN,
    UNSEEN_B,
    UNSEEN_C,
    UNSEEN_D,
    UNSEEN_E,
    UNSEEN_F,
    UNSEEN_G,
    UNSEEN_H,
)


#: Imports the modules named on its command line and prints where ``keelgate`` came from.
_IMPORT = (
    "import importlib, sys\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "print(sys.modules['keelgate'].__file__)\n"
)


def _module(file: str) -> str:
    """The module a file under ``keelgate/`` is: ``core/types.py`` -> ``keelgate.core.types``."""
    return "keelgate." + file.removesuffix(".py").replace("/", ".")


@pytest.mark.parametrize("letter", sorted(CHECKED))
def test_the_set_holds_ten_bugs_each_named_once_and_named_as_no_other_set_names_one(
    letter: str,
) -> None:
    """Ten bugs, no two with one name, and none with the name of a bug of another set."""
    bugs = CHECKED[letter]
    names = [bug.name for bug in bugs]
    assert len(names) == 10
    assert len(set(names)) == len(names)
    others = {bug.name for other in ALL_SETS if other is not bugs for bug in other}
    assert not set(names) & others


@pytest.mark.parametrize("bug", UNSEEN_F + UNSEEN_G + UNSEEN_H, ids=lambda bug: bug.name[:60])
def test_each_bug_plants_once_into_a_copy_that_still_imports(bug: Planted, tmp_path: Path) -> None:
    """Each old text occurs exactly once in the product's file (so the replacement changes that
    one place), the planted copy holds the new text instead, the tree is left as it was, and
    the copy's changed modules import."""
    before = {file: (PACKAGE / file).read_text() for file, _, _ in bug.edits}
    for file, old, new in bug.edits:
        assert before[file].count(old) == 1, f"{bug.name}: {file} holds its old text not once"
        assert old != new
    root = planted(bug, tmp_path)
    for file, old, new in bug.edits:
        text = (root / "keelgate" / file).read_text()
        assert old not in text
        assert new in text
        assert (PACKAGE / file).read_text() == before[file]
    modules = sorted({_module(file) for file, _, _ in bug.edits})
    imported = subprocess.run(
        [sys.executable, "-c", _IMPORT, *modules],
        env={"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(root)  # the copy, not the tree
