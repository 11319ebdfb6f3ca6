"""A manifest's own Python code, imported from the manifest's folder without touching sys.path
(``keelgate.adapters.loading.CallableLoader``), as a Temporal worker driving runs of many
manifests does.

What a user would notice if this broke: the first folder's ``tools.py`` answering for every
other folder's ``tools:place_order`` (the wrong WRITE run), a folder on the path shadowing a
module the worker itself imports, or code in the folder that cannot import its own neighbours.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from keelgate.adapters.loading import PRIVATE_PREFIX, CallableLoader, load_callable
from keelgate.core.spec import LoopSpec
from keelgate.errors import InputError
from keelgate.manifest import load_agentrun
from keelgate.runners.temporal.activities import Activities
from keelgate.runners.temporal.wire import DriveRequest

TOOL = """
from typing import Any

WHO = {who!r}
CALLS: list[Any] = []


def place_order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    CALLS.append(idempotency_key)
    return {{"placed_by": WHO}}
"""


def folder_with(tmp_path: Path, name: str, who: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "kg_same_tools.py").write_text(TOOL.format(who=who))
    return folder


def test_two_folders_with_the_same_module_name_do_not_collide(tmp_path: Path) -> None:
    """``kg_same_tools:place_order`` from two folders is two functions of two modules, each its
    own folder's; sys.path is the same list before and after, and no module is registered under
    the bare name, so nothing the process imports later can get either by accident."""
    path_before = list(sys.path)
    first = CallableLoader(str(folder_with(tmp_path, "a", "team-a")))
    second = CallableLoader(str(folder_with(tmp_path, "b", "team-b")))
    place_a = first.load("kg_same_tools:place_order", field="spec.tools[0].python.callable")
    place_b = second.load("kg_same_tools:place_order", field="spec.tools[0].python.callable")
    assert place_a({}, idempotency_key="k1") == {"placed_by": "team-a"}
    assert place_b({}, idempotency_key="k2") == {"placed_by": "team-b"}
    assert place_a.__module__ != place_b.__module__
    assert place_a.__module__.startswith(PRIVATE_PREFIX)
    assert sys.path == path_before
    assert "kg_same_tools" not in sys.modules
    # The same folder again is the same module (its state is kept, as an import would).
    again = first.load("kg_same_tools:place_order", field="f")
    assert again is place_a


def test_a_package_in_the_folder_imports_its_own_modules_relatively(tmp_path: Path) -> None:
    """A package in the manifest's folder with modules that import each other relatively
    loads whole; an installed module of the same top-level name elsewhere is not consulted."""
    package = tmp_path / "code" / "kg_shop"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "prices.py").write_text("def price() -> int:\n    return 7\n")
    (package / "orders.py").write_text(
        "from . import prices\n\n"
        "def place(args, *, idempotency_key=None):\n"
        "    return {'price': prices.price()}\n"
    )
    place = CallableLoader(str(tmp_path / "code")).load("kg_shop.orders:place", field="f")
    assert place({}) == {"price": 7}
    assert "kg_shop" not in sys.modules


def test_a_reference_not_in_the_folder_comes_from_the_process_path(tmp_path: Path) -> None:
    """What the folder does not hold is imported as always (installed code, the worker's own
    PYTHONPATH); a folder that does not exist on this worker changes nothing."""
    dumps = CallableLoader(str(tmp_path)).load("json:dumps", field="f")
    assert dumps is __import__("json").dumps
    assert CallableLoader(str(tmp_path / "nowhere")).load("json:dumps", field="f") is dumps
    assert load_callable("json:dumps", field="f") is dumps


@pytest.mark.parametrize(
    ("reference", "error"),
    [
        ("no_colon", "'no_colon' is not of the form 'package.module:function'"),
        ("kg_same_tools:nothing", "'kg_same_tools' has no attribute 'nothing'"),
        ("kg_same_tools:WHO", "'kg_same_tools:WHO' is not callable"),
        ("kg_absent_module:f", "cannot import 'kg_absent_module': "),
    ],
)
def test_a_bad_reference_is_one_line_naming_the_field(
    tmp_path: Path, reference: str, error: str
) -> None:
    loader = CallableLoader(str(folder_with(tmp_path, "a", "team-a")))
    with pytest.raises(InputError) as raised:
        loader.load(reference, field="spec.model.callable")
    assert str(raised.value).startswith(f"spec.model.callable: {error}")


MANIFEST = """
apiVersion: keelgate.dev/v1alpha1
kind: AgentRun
metadata: {{name: {run}, namespace: shop}}
spec:
  goal: Restock SKU A1
  model:
    provider: scripted
    script:
      - actions: [{{tool: place_order, args: {{sku: A1}}}}]
      - done: true
        answer: done
  tools:
    - name: place_order
      sideEffect: WRITE
      python: {{callable: "kg_same_tools:place_order"}}
"""


def test_a_temporal_worker_drives_runs_of_two_folders_each_with_its_own_code(
    tmp_path: Path,
) -> None:
    """The worker's drive activity runs two manifests whose folders each hold a
    ``kg_same_tools.py``: each run's WRITE is its own folder's, and the worker's sys.path is
    the same list after both."""
    path_before = list(sys.path)
    activities = Activities(store=f"sqlite:///{tmp_path / 'worker.db'}")
    try:
        answers = {}
        for run, who in (("run-a", "team-a"), ("run-b", "team-b")):
            folder = folder_with(tmp_path, run, who)
            manifest = folder / "restock.yaml"
            manifest.write_text(MANIFEST.format(run=run))
            spec: LoopSpec = load_agentrun(manifest).to_loop_spec()
            spec_json = {**spec.to_json(), "sourceDir": str(folder)}
            outcome = activities._drive(DriveRequest(spec_json))
            assert outcome.stop.reason.value == "goal_met", outcome
            answers[run] = outcome
    finally:
        activities.close()
    assert sys.path == path_before
    assert "kg_same_tools" not in sys.modules
    placed = {
        module.WHO: list(module.CALLS)
        for name, module in sys.modules.items()
        if name.startswith(PRIVATE_PREFIX)
        and name.endswith(".kg_same_tools")
        and module.__file__ is not None
        and str(tmp_path) in module.__file__
        and module.CALLS
    }
    assert sorted(placed) == ["team-a", "team-b"]
    assert all(len(calls) == 1 for calls in placed.values())
