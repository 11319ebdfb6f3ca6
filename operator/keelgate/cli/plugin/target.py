"""Which cluster, user and namespace ``kubectl keelgate`` talks to, decided as kubectl decides.

kubectl hands a plugin its arguments and nothing else: ``--kubeconfig``, ``--context`` and
``-n/--namespace`` arrive as flags the plugin must read itself, and ``KUBECONFIG`` is in the
environment. This module resolves them the way kubectl does: the ``--kubeconfig`` file, else
every file ``KUBECONFIG`` lists, else ``~/.kube/config`` (else, inside a pod, the pod's service
account); the context named by ``--context``, else the current one; the namespace given, else
the context's, else ``default``. It must never print or return a credential: a ``Target`` holds
where credentials are, never what they are.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from keelgate.errors import InputError

#: Where a pod's service account puts its namespace (kubectl reads it in-cluster too).
_POD_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Target:
    """Where one command goes: the kubeconfig file(s), the context, the namespace."""

    config_files: str  # as KUBECONFIG spells it (os.pathsep-separated); "" inside a pod
    context: str  # "" inside a pod: its service account, no kubeconfig
    namespace: str
    namespace_given: bool = False  # -n was given
    context_given: bool = False  # --context was given (shown again in the commands suggested)
    kubeconfig_given: str = ""  # the --kubeconfig given (likewise)

    @property
    def where(self) -> str:
        """How messages name the user and cluster: the context, or the pod's account."""
        return f"context {self.context}" if self.context else "the pod's service account"

    def flags(self) -> str:
        """The flags that point another command at the same place, for what-to-run-next."""
        given = (
            f" --kubeconfig {shlex.quote(self.kubeconfig_given)}" if self.kubeconfig_given else ""
        )
        given += f" --context {shlex.quote(self.context)}" if self.context_given else ""
        return f"{given} -n {shlex.quote(self.namespace)}"


def resolve(kubeconfig: str | None, context: str | None, namespace: str | None) -> Target:
    """The target of a command, from its flags and the environment; nothing is contacted."""
    if namespace is not None and not namespace.strip():
        raise InputError("--namespace", "must not be empty")
    if kubeconfig is not None:
        if not Path(kubeconfig).expanduser().is_file():
            raise InputError("--kubeconfig", f"{kubeconfig}: no such file")
        files, source = str(Path(kubeconfig).expanduser()), "--kubeconfig"
    elif os.environ.get("KUBECONFIG"):
        files, source = os.environ["KUBECONFIG"], "KUBECONFIG"
    else:
        files, source = str(Path("~/.kube/config").expanduser()), "~/.kube/config"
        if not Path(files).is_file() and _in_pod() and context is None:
            return _pod_target(namespace)
    if not any(Path(f).is_file() for f in files.split(os.pathsep) if f):
        raise InputError(source, f"no kubeconfig file at {files}")
    contexts, current = _contexts(files, source)
    name = context if context is not None else current
    if not name:
        raise InputError("--context", f"{files} names no current context: give --context")
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        flag = "--context" if context is not None else source
        raise InputError(flag, f"no context {name!r} in {files} (contexts: {known})")
    own_namespace = str(contexts[name].get("namespace") or "")
    return Target(
        config_files=files,
        context=name,
        namespace=namespace or own_namespace or "default",
        namespace_given=namespace is not None,
        context_given=context is not None,
        kubeconfig_given=kubeconfig or "",
    )


def _contexts(files: str, source: str) -> tuple[dict[str, dict[str, Any]], str]:
    """Every context of the kubeconfig files by name, and the current context's name, merged
    as kubectl merges them: the first file to name a context or a current context wins. Only
    names and namespaces are read here: no credential is touched and no plugin is run."""
    contexts: dict[str, dict[str, Any]] = {}
    current = ""
    for path in (Path(f) for f in files.split(os.pathsep) if f):
        if not path.is_file():
            continue  # as kubectl: a listed file that is not there is skipped
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            reason = _first_line(error)
            raise InputError(source, f"{path}: not a readable kubeconfig ({reason})") from None
        if not isinstance(loaded, dict):
            raise InputError(source, f"{path}: not a kubeconfig (a YAML mapping)")
        for entry in loaded.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name"):
                contexts.setdefault(str(entry["name"]), dict(entry.get("context") or {}))
        current = current or str(loaded.get("current-context") or "")
    return contexts, current


def namespace_only(kubeconfig: str | None, context: str | None, namespace: str | None) -> str:
    """The namespace a command means, without needing a usable kubeconfig when -n is given
    (``audit`` reads the store, not the cluster)."""
    if namespace is not None and kubeconfig is None and context is None:
        if not namespace.strip():
            raise InputError("--namespace", "must not be empty")
        return namespace
    return resolve(kubeconfig, context, namespace).namespace


@dataclass(frozen=True)
class Impersonation:
    """kubectl's --as and --as-group: whom the API server is asked to treat the user as (RBAC
    then decides whether the user may impersonate them)."""

    user: str = ""
    group: str = ""

    @staticmethod
    def taken_from(args: list[str]) -> tuple[list[str], Impersonation]:
        """``args`` without --as/--as-group (anywhere, as kubectl takes them), and what they
        said. One group at most: the client sends one header of each name."""
        rest: list[str] = []
        found: dict[str, list[str]] = {"--as": [], "--as-group": []}
        index = 0
        while index < len(args):
            arg = args[index]
            if arg == "--":
                rest.extend(args[index:])
                break
            name, eq, value = arg.partition("=")
            if name in found:
                if not eq:
                    if index + 1 >= len(args):
                        raise InputError(name, "needs a value")
                    index += 1
                    value = args[index]
                if not value.strip():
                    raise InputError(name, "must not be empty")
                found[name].append(value)
            else:
                rest.append(arg)
            index += 1
        if len(found["--as"]) > 1:
            raise InputError("--as", "give it once")
        if len(found["--as-group"]) > 1:
            raise InputError("--as-group", "give one group (the client sends one)")
        user = found["--as"][0] if found["--as"] else ""
        group = found["--as-group"][0] if found["--as-group"] else ""
        if group and not user:
            raise InputError("--as-group", "needs --as (a user to impersonate), as kubectl's")
        return rest, Impersonation(user, group)


#: The --as/--as-group of this process's command (set by the plugin's entry point).
IMPERSONATION = Impersonation()


def impersonate(impersonation: Impersonation) -> None:
    global IMPERSONATION
    IMPERSONATION = impersonation


def connect(target: Target) -> client.ApiClient:
    """An API client for the target, its own (nothing global is configured but the
    impersonation headers of --as/--as-group, when given)."""
    api_client = _connect(target)
    headers = cast(dict[str, str], api_client.default_headers)
    if IMPERSONATION.user:
        headers["Impersonate-User"] = IMPERSONATION.user
    if IMPERSONATION.group:
        headers["Impersonate-Group"] = IMPERSONATION.group
    return api_client


def _connect(target: Target) -> client.ApiClient:
    loader = cast(Any, config)
    try:
        if not target.context:
            configuration = client.Configuration()
            loader.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        # persist_config=False: a refreshed token is never written back into the user's file.
        api_client: client.ApiClient = loader.new_client_from_config(
            config_file=target.config_files, context=target.context, persist_config=False
        )
    except (ConfigException, OSError, ValueError) as error:
        # A user, cluster or certificate file the context names that cannot be used.
        where = target.context or "in-cluster configuration"
        raise InputError("--context", f"{where}: {_first_line(error)}") from None
    return api_client


def _in_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and _POD_NAMESPACE.is_file()


def _pod_target(namespace: str | None) -> Target:
    own = _POD_NAMESPACE.read_text(encoding="utf-8").strip()
    return Target(
        config_files="",
        context="",
        namespace=namespace or own or "default",
        namespace_given=namespace is not None,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
