"""Errors that say what to do: one table of exit codes, read by the CLI whatever the error, and
errors that survive the trip between processes.

Why it exists: a script and the operator act on exit codes (4: busy, try later; 5: the store is
away), so the code must come from the error's own class, never from which ``except`` clause
happened to catch it first. And errors cross processes (a worker reports to its parent), so each
must come back from ``pickle`` whole. The classes are found by introspection, so a new one cannot
escape either rule.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pickle
import pkgutil
import typing
from pathlib import Path
from typing import Any

import pytest

import keelgate
import keelgate.errors
from keelgate.cli import main
from keelgate.errors import KeelgateError, OutcomeUncertain


def _every_module() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(keelgate.__path__, "keelgate.")]
    return [name for name in names if not name.endswith("__main__")]


def _subclasses(root: type[BaseException]) -> set[type[BaseException]]:
    found = set(root.__subclasses__())
    for cls in list(found):
        found |= _subclasses(cls)
    return found


def error_classes() -> list[type[BaseException]]:
    """Every exception class of keelgate.errors, and every KeelgateError of the package."""
    for name in _every_module():
        importlib.import_module(name)
    in_module = {
        cls
        for _, cls in inspect.getmembers(keelgate.errors, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == "keelgate.errors"
    }
    in_package = {
        cls for cls in _subclasses(KeelgateError) if cls.__module__.startswith("keelgate.")
    }
    return sorted(in_module | in_package, key=lambda cls: f"{cls.__module__}.{cls.__name__}")


def _sample(annotation: Any, name: str) -> Any:
    """A value of the annotated type, different for each parameter name."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, type(int | None)) and options:
        return _sample(options[0], name)
    if annotation is bool:
        return True
    if annotation is int:
        return len(name) + 3
    if annotation is float:
        return len(name) + 0.5
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        hints = typing.get_type_hints(annotation)
        return annotation(
            **{f.name: _sample(hints[f.name], f.name) for f in dataclasses.fields(annotation)}
        )
    return f"<{name}>"


def sample_error(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` with every required parameter (and any ``**fields``) filled."""
    hints = typing.get_type_hints(cls.__init__)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if parameter.kind is parameter.VAR_KEYWORD:
            kwargs["detail"] = "<detail>"
        elif parameter.default is parameter.empty:
            value = _sample(hints.get(parameter.name, str), parameter.name)
            if parameter.kind is parameter.KEYWORD_ONLY:
                kwargs[parameter.name] = value
            else:
                args.append(value)
    return cls(*args, **kwargs)


CLASSES = error_classes()


def test_the_introspection_finds_every_error_class() -> None:
    names = {cls.__name__ for cls in CLASSES}
    assert {"KeelgateError", "InputError", "SimulatedCrash", "UnknownOutcomeStop"} <= names
    assert "OutcomeUnknown" not in names  # the gateway's signal has a name of its own


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_survives_pickling_with_its_message_and_fields(
    cls: type[BaseException],
) -> None:
    """What a worker process raises reaches its parent as the same error: the same class,
    message, ``args`` and fields (a KeelgateError's ``fields`` and its own attributes)."""
    error = sample_error(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)
    if isinstance(error, KeelgateError):
        assert isinstance(copy, KeelgateError)
        assert (copy.message, copy.fields) == (error.message, error.fields)
        assert (copy.exit_code, copy.retryable) == (error.exit_code, error.retryable)


def test_an_uncertain_call_still_running_here_arrives_elsewhere_as_merely_uncertain() -> None:
    """The call still running is one of this process: another process gets the message, and no
    call it could wait for (a live call may not even pickle)."""

    class Running:
        def __reduce__(self) -> Any:
            raise TypeError("a live call does not pickle")

    error = OutcomeUncertain("timed out after 30s", still_running=Running())
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == "timed out after 30s"
    assert copy.still_running is None
    assert error.still_running is not None  # the original keeps its call


@pytest.mark.parametrize(
    "cls",
    [cls for cls in CLASSES if issubclass(cls, KeelgateError)],
    ids=lambda cls: cls.__name__,
)
def test_the_cli_exits_with_the_code_the_error_table_gives(
    cls: type[KeelgateError],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Whatever KeelgateError a command meets, ``keelgate`` exits with that class's
    ``exit_code`` and says one line naming it: the table decides, not the order of clauses."""
    error = sample_error(cls)
    assert isinstance(error, KeelgateError)

    def refuse(store: str, **_: Any) -> Any:
        raise error

    monkeypatch.setattr("keelgate.cli.commands.open_existing", refuse)
    code = main(["runs", "--store", f"sqlite:///{tmp_path / 'kg.db'}"])
    assert code == cls.exit_code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and str(error) in err, err


def test_the_operator_reads_a_step_pods_exit_code_from_the_same_table() -> None:
    """A step pod that exits with an error's code is retried by the operator when the table
    says the error is retryable (busy, unavailable) and leaves the run Stalled until its spec
    changes when it says it is not (bad input); 0, 1 and 3 are a step that recorded its end, and
    a code no error has (a signal's 137) is a crash, retried with back-off. A model server that
    could not be reached is 3 too: the step ended with the run where it stands, and the next
    step tries the model again. A step refused for a stale epoch (``EXIT_FENCED``) is fenced:
    another holder took the run over, so it is neither a crash nor retried here."""
    from keelgate.core.exits import EXIT_FENCED
    from keelgate.errors import exit_retryable
    from keelgate.kube.controller.pod_ends import classify

    def ended(code: int) -> str:
        pod = {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": code}}}]}}
        return classify(pod).kind

    codes = {cls.exit_code for cls in error_classes() if issubclass(cls, KeelgateError)} - {1, 3}
    assert codes == {2, 4, 5, 6, 75}
    for code in codes:
        kind = ended(code)
        if code == EXIT_FENCED:
            # Refused for the run's epoch: the run is another holder's now, and only whoever
            # holds it makes its next step pod (not busy's retry after a wait, not a crash).
            assert kind == "fenced"
        elif exit_retryable(code):
            assert kind in ("busy", "store", "preempted"), code
        else:
            assert kind == "bad_input", code
    assert ended(75) == "preempted"
    assert [ended(code) for code in (0, 1, 3)] == ["clean"] * 3
    assert ended(137) == "crash"
