"""``keelgate tenant add|move|remove|list``: give a namespace its own database role and database
on a shared PostgreSQL server, and the Secret its step pods read the store URL from.

Why it exists: with one shared URL every tenant's step pods (which run the tenant's own tool
code) could read and change every other tenant's runs. A role per tenant, held by PostgreSQL's
row-level security (``keelgate.stores.tenancy``), confines each to its own. This module is the
command line: it checks its input, talks to the cluster for the Secret as the kubeconfig's user
(as kubectl would), and says what it did in one line. It must never print or log a password:
the only place one goes is the Secret, or stdout with ``--print`` (asked for explicitly).

Why one module past 500 lines: the four commands share their options, their checks of input and how
a result is said, and add, move and remove keep one order (the cluster asked first, so that a
refusal there leaves the database unchanged); read apart, that order would be in three places. What
the database does is ``keelgate.stores.tenancy``'s, the Secret ``keelgate.cli.secrets``'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from keelgate.cli.commands import OutputFormat, OutputOption, app
from keelgate.cli.help import App
from keelgate.cli.listing import table
from keelgate.cli.render import Console
from keelgate.errors import InputError, KeelgateError
from keelgate.stores import StoreUrl, read_store_url

if TYPE_CHECKING:
    from keelgate.cli.secrets import StoreSecrets
    from keelgate.stores.tenancy import Added, Tenant, TenantStore

tenant_app = App(
    name="tenant",
    help=(
        "The database roles of tenants (namespaces) in a shared PostgreSQL store: each sees and "
        "changes only its own runs. Needs the store's administrator URL."
    ),
)
app.add_typer(tenant_app, name="tenant")

NamespaceArgument = Annotated[
    str, typer.Argument(help="The tenant: a namespace.", show_default=False)
]
AdminStoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="KEELGATE_STORE",
        help="The store's administrator URL (postgresql://...; env KEELGATE_STORE): a role "
        "that owns Keelgate's tables and may create roles.",
        show_default=False,
    ),
]
SecretOption = Annotated[
    str,
    typer.Option(
        "--secret", help="The Secret (key 'url') in the namespace; the operator's --store-secret."
    ),
]
KubeconfigOption = Annotated[
    str | None, typer.Option("--kubeconfig", help="The kubeconfig file (as kubectl reads it).")
]
ContextOption = Annotated[str | None, typer.Option("--context", help="The kubeconfig context.")]


def _admin_url(store: str) -> StoreUrl:
    """The administrator URL, read; one that cannot be one is refused before anything is
    contacted."""
    if not store:
        raise InputError("--store", "give the store's administrator URL (or KEELGATE_STORE)")
    read = read_store_url(store)
    if not read.postgres:
        raise InputError(
            "--store",
            "tenant roles exist in PostgreSQL only (a SQLite file has one user: its file's)",
        )
    return read


def _admin(store: StoreUrl) -> TenantStore:
    """The administrator's session on the store (PostgreSQL only)."""
    from keelgate.stores.tenancy import TenantStore

    return TenantStore(store)


def _cluster(kubeconfig: str | None, context: str | None, namespace: str) -> StoreSecrets:
    # Loaded here: the other commands never pay for the Kubernetes client.
    from keelgate.cli.plugin.target import resolve
    from keelgate.cli.secrets import StoreSecrets

    return StoreSecrets(resolve(kubeconfig, context, namespace))


def _secret_url(url: str) -> StoreUrl | None:
    """The URL a Secret holds, read (None for none, or one that cannot be read: then neither
    its password nor its host is kept)."""
    try:
        return read_store_url(url) if url else None
    except InputError:
        return None


@dataclass(frozen=True)
class _Said:
    """One command's result, for a person and as JSON."""

    line: str
    document: dict[str, Any]


def _say(said: _Said, output: OutputFormat) -> None:
    console = Console()
    if output is OutputFormat.json:
        console.json(said.document)
    else:
        console.say(said.line)


@tenant_app.command("add")
def add_command(
    namespace: NamespaceArgument,
    store: AdminStoreOption = "",
    operator: Annotated[
        bool,
        typer.Option(
            "--operator",
            help="The operator's role instead: it reads every tenant and writes what the "
            "operator writes; its Secret goes in NAMESPACE (the operator's own).",
        ),
    ] = False,
    role: Annotated[
        str,
        typer.Option(
            "--role", help="The role's name (default keelgate-NAMESPACE, or keelgate-operator)."
        ),
    ] = "",
    secret: SecretOption = "keelgate-store",
    print_url: Annotated[
        bool,
        typer.Option(
            "--print",
            help="Print the URL (with its password) on stdout instead of writing the Secret; "
            "the cluster is not contacted.",
        ),
    ] = False,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Set a new password even if the Secret's works.")
    ] = False,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="HOST[:PORT] step pods reach the database at (default: the Secret's, else "
            "the administrator URL's).",
        ),
    ] = "",
    connection_limit: Annotated[
        int | None,
        typer.Option(
            "--connection-limit",
            help="Sessions the role may hold at once on the server (default 20 for a tenant, 32 "
            "for the operator; a role that has a limit keeps it).",
            show_default=False,
        ),
    ] = None,
    lock_limit: Annotated[
        int | None,
        typer.Option(
            "--lock-limit",
            help="Runs the tenant's sessions may drive at once (default 64; a registered role "
            "keeps its own).",
            show_default=False,
        ),
    ] = None,
    shared_database: Annotated[
        bool,
        typer.Option(
            "--shared-database",
            help="Keep a new tenant's rows in the store's own database, shared with other "
            "tenants (who can then delay its statements), instead of a database of its own.",
        ),
    ] = False,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Give NAMESPACE its own database role (created with a generated password, granted only
    its rows, with connection and lock limits) and a database of its own on the server, and
    write the URL into its Secret. Run again, it changes nothing that works. It also closes
    what it may of the ways one tenant could delay another through what the server shares,
    and warns of what is left."""
    kind = "operator" if operator else "tenant"
    return _add(
        namespace,
        store,
        kind=kind,
        role=role,
        secret=secret,
        print_url=print_url,
        rotate=rotate,
        host=host,
        connection_limit=connection_limit,
        lock_limit=lock_limit,
        shared_database=shared_database,
        kubeconfig=kubeconfig,
        context=context,
        output=output,
    )


@tenant_app.command("move")
def move_command(
    namespace: NamespaceArgument,
    store: AdminStoreOption = "",
    secret: SecretOption = "keelgate-store",
    print_url: Annotated[
        bool,
        typer.Option(
            "--print",
            help="Print the new URL (with a new password) on stdout instead of writing the "
            "Secret; the cluster is not contacted.",
        ),
    ] = False,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Move NAMESPACE, a tenant of an install from before that shares the store's database,
    into a database of its own: its runs, keys, audit trails and specs are copied, checked and
    then deleted from the shared database, and its Secret's URL is pointed at the new one.
    Stop the operator (and any process using a shared URL) first: it refuses while they are
    connected."""
    return _add(
        namespace,
        store,
        kind="tenant",
        role="",
        secret=secret,
        print_url=print_url,
        rotate=print_url,
        host="",
        connection_limit=None,
        lock_limit=None,
        shared_database=False,
        kubeconfig=kubeconfig,
        context=context,
        output=output,
        move=True,
    )


def _add(
    namespace: str,
    store: str,
    *,
    kind: str,
    role: str,
    secret: str,
    print_url: bool,
    rotate: bool,
    host: str,
    connection_limit: int | None,
    lock_limit: int | None,
    shared_database: bool,
    kubeconfig: str | None,
    context: str | None,
    output: OutputFormat,
    move: bool = False,
) -> int:
    """``tenant add`` (and ``tenant move``, which moves the tenant's rows first)."""
    from keelgate.stores.tenancy import (
        check_host,
        check_limit,
        check_namespace,
        check_role,
        default_role,
    )

    admin_url = _admin_url(store)
    check_namespace(namespace)
    check_role(role or default_role(namespace, kind))
    check_host(host)
    check_limit(connection_limit, "--connection-limit")
    check_limit(lock_limit, "--lock-limit")
    before = None
    if not print_url:
        # The cluster first: a namespace that is not there, or a user who may not write its
        # Secrets, stops the command before the database changes.
        before = _secret_before(
            admin_url,
            namespace,
            role or default_role(namespace, kind),
            secret=secret,
            host=host,
            cluster=_cluster(kubeconfig, context, namespace),
        )
        host = before.host
    where = moved = ""
    with _admin(admin_url) as admin:
        if move:
            went = admin.move(namespace)
            moved = f"; moved {went.kept.words()} into database {went.database}"
        added = admin.add(
            namespace,
            kind=kind,
            role=role,
            working_password=before.working if before is not None else "",
            rotate=rotate,
            host=host,
            new_url=print_url,
            connection_limit=connection_limit,
            lock_limit=lock_limit,
            shared=shared_database,
        )
        if before is not None:
            where = _write_secret(
                before, admin, added, admin_url, namespace=namespace, secret=secret
            )
    line = _added_line(added, kind, namespace) + moved + where
    for way in (*added.open, *added.unbounded):
        # What this URL could not close: a warning, not a failure (the role works).
        Console().warn(way)
    if print_url:
        Console().err.print(line, markup=False, highlight=False)
        Console().say(added.url)
        return 0
    database = added.tenant.database
    _say(
        _Said(
            line,
            {
                "namespace": namespace,
                "role": added.tenant.role,
                "kind": kind,
                "created": added.created,
                "passwordSet": added.password,
                "secret": f"{namespace}/{secret}",
                "connectionLimit": added.tenant.connection_limit,
                "lockLimit": added.tenant.lock_limit,
                "database": database or None,
                "moved": bool(moved),
                "open": list(added.open),
                "unbounded": list(added.unbounded),
            },
        ),
        output,
    )
    return 0


@dataclass(frozen=True)
class _SecretBefore:
    """A namespace's Secret as ``tenant add`` found it, before anything changed."""

    cluster: StoreSecrets
    exists: bool
    url: str  # the URL it holds ("" for none)
    working: str  # the role's password in it ("" for none, or a URL that cannot be read)
    host: str  # where step pods reach the database: --host, else the Secret's ("" for neither)


def _secret_before(
    admin_url: StoreUrl, namespace: str, role: str, *, secret: str, host: str, cluster: StoreSecrets
) -> _SecretBefore:
    """Read the namespace's Secret and ask the API server, in a dry run of the write (no
    password in it), whether the user may write it: a refusal here leaves the database as it
    was. Where step pods reach the database stays as the Secret says, unless ``--host``
    changes it."""
    current = cluster.read(secret)
    current_url = cluster.url_of(current)
    current_read = _secret_url(current_url)
    working = current_read.password_of(role) if current_read else ""
    host = host or (current_read.hosts if current_read else "")
    exists = current is not None
    cluster.write(
        secret, admin_url.with_login(role, "x", host=host), role, exists=exists, dry_run=True
    )
    return _SecretBefore(cluster, exists, current_url, working, host)


def _write_secret(
    before: _SecretBefore,
    admin: TenantStore,
    added: Added,
    admin_url: StoreUrl,
    *,
    namespace: str,
    secret: str,
) -> str:
    """Write the role's URL into the Secret unless it holds it already, and say which (the
    words end the command's line). A password that works is kept; the URL around it is
    written as asked (--host). A write that fails after the dry run passed undoes what it can
    (``_not_written``)."""
    tenant = added.tenant
    url = added.url or admin_url.with_login(
        tenant.role, before.working, host=before.host, database=tenant.database
    )
    if url == before.url:
        return f"; Secret {namespace}/{secret} unchanged"
    try:
        before.cluster.write(secret, url, tenant.role, exists=before.exists)
    except KeelgateError as error:
        raise _not_written(error, admin, added, f"{namespace}/{secret}") from None
    done = "updated" if before.exists else "written"
    return f"; Secret {namespace}/{secret} {done} (key url)"


def _added_line(added: Added, kind: str, namespace: str) -> str:
    """What ``tenant add`` did, in words: the role made or kept, its password, its database and
    its limits (the move and the Secret are said after it)."""
    tenant = added.tenant
    made = "created" if added.created else "kept"
    password = "a new password" if added.password else "its password unchanged"
    kind_words = "operator" if kind == "operator" else f"tenant {namespace}"
    limits = f"at most {tenant.connection_limit} session(s)"
    if kind == "tenant":
        limits += f" and {tenant.lock_limit} run(s) at once"
        place = (
            f"database {tenant.database} of its own"
            if tenant.database
            else "the store's own database, shared with other tenants"
        )
        limits = f"{place}, {limits}"
    return f"{kind_words}: role {tenant.role} {made}, with {password}, {limits}"


def _not_written(
    error: KeelgateError, admin: TenantStore, added: Added, secret: str
) -> KeelgateError:
    """The Secret could not be written after all (the dry run passed, the write did not): a
    role this command created is taken away again, so no password is left stored nowhere; the
    error keeps its class (and exit code) and says what is left."""
    role = added.tenant.role
    if added.created:
        admin.remove(added.tenant.tenant)
        left = f"role {role}, created for it, was removed again: nothing changed"
    elif added.password:
        left = (
            f"role {role} now has a new password stored nowhere (its old one is gone): run the "
            "same command again once the Secret can be written, and it sets another"
        )
    else:
        left = f"role {role} is as it was"
    error.message = f"{error.message}; Secret {secret} not written, so {left}"
    error.args = (error.message,)
    return error


@tenant_app.command("remove")
def remove_command(
    namespace: NamespaceArgument,
    store: AdminStoreOption = "",
    secret: SecretOption = "keelgate-store",
    keep_secret: Annotated[
        bool,
        typer.Option(
            "--keep-secret", help="Leave the namespace's Secret; the cluster is not contacted."
        ),
    ] = False,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Take NAMESPACE's role away (its rights, its sessions, the role) and the Secret
    `tenant add` wrote. Its runs, keys, audit trails and specs stay in the store."""
    from keelgate.stores.tenancy import check_namespace

    admin_url = _admin_url(store)
    check_namespace(namespace)
    cluster = None
    current = None
    if not keep_secret:
        cluster = _cluster(kubeconfig, context, namespace)
        current = cluster.read(secret)  # none in a namespace that is not there
    with _admin(admin_url) as admin:
        removed = admin.remove(namespace)
        kept = admin.kept(namespace)
        database = admin.database_of(namespace)
    deleted = []
    for done in removed:
        if cluster is not None and cluster.ours(current, done.tenant.role):
            cluster.delete(secret)
            deleted.append(f"Secret {namespace}/{secret} deleted")
    parts = []
    for done in removed:
        fate = (
            "dropped" if done.dropped else "kept (it has rights in another database), revoked here"
        )
        parts.append(f"role {done.tenant.role} {fate}, {done.sessions} session(s) ended")
    if not removed:
        parts.append("no role was registered for it")
    parts.extend(deleted)
    place = f"its database {database}" if database else admin_url.shown
    line = (
        f"tenant {namespace}: {'; '.join(parts)}. Kept in {place}: {kept.words()} of "
        f"{namespace} (the administrator URL reads them; `keelgate tenant add {namespace}` "
        "gives them to a new role)"
    )
    document = {
        "namespace": namespace,
        "removed": [
            {
                "role": d.tenant.role,
                "kind": d.tenant.kind,
                "dropped": d.dropped,
                "sessionsEnded": d.sessions,
            }
            for d in removed
        ],
        "secretDeleted": bool(deleted),
        "database": database or None,
        "kept": {"runs": kept.runs, "keys": kept.keys, "events": kept.events, "specs": kept.specs},
    }
    _say(_Said(line, document), output)
    return 0


@tenant_app.command("list")
def list_command(store: AdminStoreOption = "", output: OutputOption = OutputFormat.text) -> int:
    """The registered roles, and the tenants with runs but no role of their own."""
    with _admin(_admin_url(store)) as admin:
        tenants = admin.tenants()
        unregistered = admin.unregistered()
        # Each tenant's database is brought to today's schema (after an upgrade, this is the
        # command that does it); one that cannot be is a warning naming it, not the end.
        open_ways = admin.migrate_tenants()
        runs: dict[str, int | None] = {}
        for name in [t.tenant for t in tenants] + unregistered:
            try:
                runs[name] = admin.kept(name).runs
            except KeelgateError as error:
                runs[name] = None
                open_ways.append(f"tenant {name}: {error}")
        # Ways a role could still delay another, one line each, once each.
        for t in tenants:
            if runs[t.tenant] is not None:
                open_ways.extend(admin.open_ways(t.role))
        open_ways.extend(admin.unbounded())
        open_ways = list(dict.fromkeys(open_ways))
    console = Console()
    if output is OutputFormat.json:
        console.json(
            {
                "tenants": [
                    {
                        "namespace": t.tenant,
                        "role": t.role,
                        "kind": t.kind,
                        "addedAt": t.added_at,
                        "runs": runs[t.tenant],
                        "connectionLimit": t.connection_limit,
                        "lockLimit": t.lock_limit if t.kind == "tenant" else None,
                        "database": t.database or None,
                    }
                    for t in tenants
                ],
                "withoutRole": unregistered,
                "open": open_ways,
            }
        )
        return 0
    if not tenants and not unregistered:
        console.say("no tenants in this store")
        return 0
    for way in open_ways:
        console.warn(way)

    def limit(value: int) -> str:
        return "none" if value < 0 else str(value)

    def count(value: int | None) -> str:
        return "?" if value is None else str(value)

    def place(t: Tenant) -> str:
        return "-" if t.kind != "tenant" else t.database or "shared"

    rows = [("NAMESPACE", "ROLE", "KIND", "DATABASE", "RUNS", "SESSIONS", "LOCKS", "ADDED")]
    rows += [
        (
            t.tenant,
            t.role,
            t.kind,
            place(t),
            count(runs[t.tenant]),
            limit(t.connection_limit),
            limit(t.lock_limit) if t.kind == "tenant" else "-",
            t.added_at,
        )
        for t in tenants
    ]
    rows += [
        (name, "-", "none (shared URL)", "shared", count(runs[name]), "-", "-", "-")
        for name in unregistered
    ]
    console.say(table(rows))
    return 0
