"""The one exception tree of Keelgate.

Every error a user can meet is a ``KeelgateError`` with structured fields, so the CLI and the
operator can turn it into one clear line (and an exit code) without parsing messages. Each class
declares its exit code (``exit_code``: the same for ``keelgate`` and a step pod, whose exit code
the operator reads) and whether the same call may succeed later unchanged (``retryable``): one
table, read by the CLI, the step pod and the operator alike. Errors cross processes (a worker
reports to its parent, a runner to its caller), so every error here survives ``pickle`` with its
message and fields. This module must never import anything from Keelgate or third parties: every
floor imports it.
"""

from __future__ import annotations

from typing import Any, ClassVar


def _unpickled(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An error rebuilt by ``pickle``: its ``args`` without running its ``__init__`` (whose
    parameters are not its ``args``); its fields come back with the state that follows."""
    return cls.__new__(cls, *args)


class KeelgateError(Exception):
    """Base of every error Keelgate raises on purpose."""

    #: Exit code of a command that ends with this error: 1 failed, 2 bad input, 3 resumable (the
    #: model server could not be reached: run again), 4 busy (another live process drives the
    #: run), 5 the store cannot be reached, 6 the run's ownership moved to another holder.
    exit_code: ClassVar[int] = 1
    #: True if the same call, unchanged, may succeed later (a store back up, a driver gone).
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own reduction calls the class with ``args`` (the message alone), which
        # fails for every subclass whose ``__init__`` takes its fields instead.
        return (_unpickled, (type(self), self.args), self.__dict__)


class InputError(KeelgateError):
    """Bad input from a user: a manifest field, a flag or an argument (exit code 2)."""

    exit_code = 2

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message, field=field)
        self.field = field
        self.reason = message


#: The extras of the ``keelgate`` package (pyproject.toml) by the top-level modules they bring:
#: a module of one of them that cannot be imported is that extra missing from the install.
EXTRA_OF_MODULE: dict[str, str] = {
    "kopf": "operator",
    "prometheus_client": "operator",
    "aiohttp": "operator",
    "cloudevents": "operator",
    "openai": "openai",
    "anthropic": "anthropic",
    "mcp": "mcp",
    "httpx2": "mcp",
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "langgraph": "langgraph",
    "temporalio": "temporal",
    "opentelemetry": "tracing",
}


class MissingExtra(InputError):
    """What was asked for needs an extra of the ``keelgate`` package that this install lacks
    (exit code 2, as any input this install cannot act on): one line naming the extra and the
    ``pip install`` that brings it, never an import error."""

    def __init__(self, extra: str, *, field: str = "", what: str = "", module: str = "") -> None:
        missing = f" ({module} is not installed)" if module else ""
        subject = f"{what} needs" if what else "needs"
        super().__init__(
            field, f"{subject} the {extra} extra: pip install 'keelgate[{extra}]'{missing}"
        )
        self.fields.update(extra=extra, module=module)
        self.extra = extra
        self.module = module

    @classmethod
    def of(cls, error: ImportError, *, field: str = "", what: str = "") -> MissingExtra | None:
        """The extra whose module ``error`` could not import; None when no extra brings it (a
        module of Keelgate's own, or of the user's code: not this error)."""
        module = (error.name or "").split(".")[0]
        extra = EXTRA_OF_MODULE.get(module)
        if extra is None:
            return None
        return cls(extra, field=field, what=what, module=module)


class RunNotFound(KeelgateError):
    """No checkpoint exists for the named run."""

    exit_code = 2

    def __init__(self, tenant: str, run: str) -> None:
        super().__init__(f"run {run!r} not found in tenant {tenant!r}", tenant=tenant, run=run)
        self.tenant = tenant
        self.run = run


class StoreError(KeelgateError):
    """A store could not do what was asked; saved state is unchanged."""


class StoreUnavailable(StoreError):
    """The store cannot be opened or reached: no server there, a file that is not a store, a
    folder that cannot be written. Nothing was read or written; the same command may succeed
    once the store is there (the CLI's exit code 5)."""

    exit_code = 5
    retryable = True


class StoreBusy(StoreError):
    """A store's statement waited as long as it may and was given up: for a lock another
    session held past the store's ``lock_timeout``, or past its ``statement_timeout``. The
    message names the store, what waited and for how long. That statement changed nothing; the
    same call may succeed once the other session lets go (the CLI's exit code 4, as for a busy
    run)."""

    exit_code = 4
    retryable = True

    def __init__(self, where: str, what: str, *, waited: str, seconds: float) -> None:
        super().__init__(
            self.words(where, what, waited, seconds),
            where=where,
            what=what,
            waited=waited,
            seconds=seconds,
        )
        self.where = where
        self.what = what
        self.waited = waited  # "lock_timeout" or "statement_timeout"
        self.seconds = seconds

    @staticmethod
    def words(where: str, what: str, waited: str, seconds: float) -> str:
        if waited == "lock_timeout":
            how = f"waited {seconds:g} s (its lock_timeout) for a lock another session holds"
        else:
            how = f"ran {seconds:g} s (its statement_timeout) and was cancelled"
        return f"{where}: {what or 'a statement'} {how}; it changed nothing: try again later"

    def doing(self, what: str) -> StoreBusy:
        """The same wait, saying what the store was doing (the statement knows no more)."""
        return StoreBusy(self.where, what, waited=self.waited, seconds=self.seconds)


class ClusterUnavailable(KeelgateError):
    """The Kubernetes API server cannot be reached (``kubectl keelgate``): the same command may
    succeed once it answers (exit code 5, as for a store). The message says whether anything
    may have been written."""

    exit_code = 5
    retryable = True


class TemporalUnavailable(KeelgateError):
    """The Temporal server cannot be reached (``keelgate temporal ...``, a worker starting):
    nothing was started or decided; the same command may succeed once it answers (exit 5, as
    for a store)."""

    exit_code = 5
    retryable = True


class StaleCheckpoint(StoreError):
    """A checkpoint save was refused because the store already holds this sequence or newer.

    This is how a second writer of the same run learns it lost the race: it must stop, not retry.
    """

    exit_code = 4
    retryable = True  # once the other writer is done, the run can be driven again

    def __init__(self, tenant: str, run: str, seq: int, stored_seq: int | None) -> None:
        super().__init__(
            self.refusal(run, seq, stored_seq),
            tenant=tenant,
            run=run,
            seq=seq,
            stored_seq=stored_seq,
        )
        self.tenant = tenant
        self.run = run
        self.seq = seq
        self.stored_seq = stored_seq

    @staticmethod
    def refusal(run: str, seq: int, stored_seq: int | None) -> str:
        """The message: what was refused (a subclass refuses something else, with these fields)."""
        return f"checkpoint {seq} of run {run!r} refused: the store already holds {stored_seq}"


class StaleClaim(StaleCheckpoint):
    """A WRITE's or PROPOSE's claim was refused because the run's checkpoint has moved on past
    the one its action was planned from: another process drove the run meanwhile (this one was
    held up, and its store session, or its run lock, was lost). Nothing was claimed, nothing was
    sent; like any stale writer, this process must stop, not retry."""

    @staticmethod
    def refusal(run: str, seq: int, stored_seq: int | None) -> str:
        return (
            f"a call of run {run!r} planned at checkpoint {seq} was not made: the run has moved "
            f"on to checkpoint {stored_seq} (another process drove it meanwhile); nothing was sent"
        )


class StaleEpoch(StoreError):
    """A write was refused because the run's ownership moved on: the store records another
    holder, or a later epoch of this one, than the epoch the write was started under (its lease
    lapsed, in a pause or a partition, and another holder took the run). Nothing was written.
    This process no longer drives the run and must stop, never retry: the new holder reads
    whatever WRITE this one left in flight as an unknown outcome (exit code 6)."""

    exit_code = 6

    def __init__(self, tenant: str, run: str, epoch: int | None, holder: str, current: int) -> None:
        started = "without an epoch" if epoch is None else f"under epoch {epoch}"
        super().__init__(
            f"run {run!r} is driven by {holder!r} under epoch {current}: a write started "
            f"{started} was refused, nothing was written; this process no longer drives it",
            tenant=tenant,
            run=run,
            epoch=epoch,
            holder=holder,
            current=current,
        )
        self.tenant = tenant
        self.run = run
        self.epoch = epoch
        self.holder = holder
        self.current = current


class UnreadableEvent(StoreError):
    """A stored audit event cannot be read back: its data is not a JSON object. Only an edit
    made outside Keelgate leaves one, so ``audit --verify`` reports it as a broken chain."""

    def __init__(
        self, tenant: str, run: str, seq: int, type: str, key: str | None, hash: str
    ) -> None:
        super().__init__(
            f"audit event {seq} ({type}) of run {run!r} cannot be read: its stored data is not "
            "a JSON object (edited outside Keelgate?)",
            tenant=tenant,
            run=run,
            seq=seq,
            type=type,
            key=key,
            hash=hash,
        )
        self.tenant = tenant
        self.run = run
        self.seq = seq
        self.type = type
        self.key = key
        self.hash = hash


class RunBusy(KeelgateError):
    """Another live process is executing this run right now; this one must not act."""

    exit_code = 4
    retryable = True

    def __init__(self, tenant: str, run: str, detail: str) -> None:
        super().__init__(f"run {run!r} is busy: {detail}", tenant=tenant, run=run)
        self.tenant = tenant
        self.run = run


class SettleError(KeelgateError):
    """A reconcile or approval was refused (nothing to settle, or already settled)."""

    exit_code = 2

    def __init__(self, run: str, action: str, message: str) -> None:
        super().__init__(f"{run} {action}: {message}", run=run, action=action)
        self.run = run
        self.action = action


class SettleTooEarly(SettleError):
    """A settlement "not executed" came before the WRITE's deadline had passed on the store's
    clock: until then the call may still be sent by a process that was held up, so nobody can
    know yet that it was not. "Executed" may be settled at once; "not executed" after
    ``not_before`` (UTC, ISO 8601), ``retry_after`` seconds from when it was refused."""

    exit_code = 4
    retryable = True

    def __init__(self, run: str, action: str, *, not_before: str, retry_after: float) -> None:
        wait = max(1, int(retry_after + 0.999))
        super().__init__(
            run,
            action,
            f"its call may still be sent until {not_before} (in {wait}s), so it cannot be "
            "settled as not executed yet: settle it as not executed after that, or as executed "
            "now",
        )
        self.fields.update(not_before=not_before, retry_after=retry_after)
        self.not_before = not_before
        self.retry_after = retry_after


class Preempted(KeelgateError):
    """The process was asked to stop (SIGTERM: a node drain, an eviction, a rollout) and
    stopped at the run's next checkpoint, after the call it was in had ended and was recorded:
    nothing is unknown, and the next process goes on from there (exit code 75, as sysexits'
    EX_TEMPFAIL). The operator starts the next step without counting a crash."""

    exit_code = 75
    retryable = True

    def __init__(self, tenant: str, run: str) -> None:
        super().__init__(
            f"run {run!r} stopped at its checkpoint: the process was asked to stop; the next "
            "step goes on from there",
            tenant=tenant,
            run=run,
        )
        self.tenant = tenant
        self.run = run


class ToolError(KeelgateError):
    """A tool's definite failure: the call was refused and took no effect.

    Tools raise it to say "nothing happened"; the model sees the message. Any other exception from
    a WRITE is read as "we do not know whether it happened" and stops the run.
    """


class OutcomeUncertain(KeelgateError):
    """A tool cannot tell whether its side effect happened (timeout, reset after sending).

    ``still_running``, when set, is the call itself, still going in this process (a timed-out
    worker): an object with ``when_done(callback)`` that calls ``callback(result, error)`` once
    the call ends. The gateway then keeps the key in flight until that moment, so nobody can
    judge the outcome while it may still change.
    """

    def __init__(self, message: str, *, still_running: Any = None) -> None:
        super().__init__(message)
        self.still_running = still_running

    def __reduce__(self) -> tuple[Any, ...]:
        # The call still running is one in this process: in another it is no call at all, and a
        # live call may not pickle. The copy says only that the outcome is uncertain.
        restore, args, state = super().__reduce__()
        return (restore, args, {**state, "still_running": None})


class ModelError(KeelgateError):
    """The model provider refused a request or answered something unusable; the run fails."""


class ModelUnavailable(ModelError):
    """The provider stayed unreachable or overloaded through every retry.

    Not a stop: nothing about the call was saved, so the run is exactly where it was and the
    same command (or the operator's next attempt) tries again. Hence exit code 3, resumable
    (running again is the fix), not 1: a script must not give up on the run; a step pod's 3
    is a step that ended with the run where it stands, as the operator reads it.
    """

    exit_code = 3
    retryable = True


class RemoteError(KeelgateError):
    """An error another process met on this one's behalf (a Temporal worker driving or settling
    a run), carried back by its class's name and message. It keeps that class's place in the
    table: ``origin_exit_code`` and ``origin_retryable`` are the named class's (those of
    ``KeelgateError`` for a name this version does not know), so ``keelgate temporal ...``
    exits as the same mistake would locally."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message, kind=kind)
        self.kind = kind
        origin = _by_name().get(kind, KeelgateError)
        self.origin_exit_code = origin.exit_code
        self.origin_retryable = origin.retryable


def exit_retryable(code: int) -> bool | None:
    """What the table says of a process that exited with ``code``: True if running it again
    unchanged may succeed (every class with that code is retryable), False if it cannot (none
    is), None if the table does not decide (no class has the code, or classes of both kinds
    share it, as 1 does). The operator reads a step pod's exit code with it."""
    kinds = {cls.retryable for cls in _by_name().values() if cls.exit_code == code}
    return kinds.pop() if len(kinds) == 1 else None


def _by_name() -> dict[str, type[KeelgateError]]:
    found: dict[str, type[KeelgateError]] = {}
    pending: list[type[KeelgateError]] = [KeelgateError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending.extend(cls.__subclasses__())
    return found


class SimulatedCrash(BaseException):
    """Raised by a failpoint armed in ``raise`` mode: an in-process stand-in for a process death.

    A BaseException, so that no ``except Exception`` on the way up can swallow it, just as nothing
    can catch ``os._exit``.
    """

    def __init__(self, failpoint: str, occurrence: int) -> None:
        super().__init__(f"failpoint {failpoint}@{occurrence}")
        self.failpoint = failpoint
        self.occurrence = occurrence

    def __reduce__(self) -> tuple[Any, ...]:
        # A crash in a worker process is reported to its parent: see KeelgateError.__reduce__.
        return (_unpickled, (type(self), self.args), self.__dict__)
