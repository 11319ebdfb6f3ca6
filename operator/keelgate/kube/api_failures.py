"""What the API server's refusals become: three outcomes a controller can act on.

``Conflict`` (409: it exists, or someone changed it first), ``Gone`` (404, naming what was not
found) and ``ApiFailure`` (anything else, retried later). Why a module of their own: the
controller acts on them without importing the Kubernetes client (``keelgate.kube.api`` raises
them; a test's fake API server raises the same). Values only: nothing here calls anything.
"""

from __future__ import annotations


class ApiFailure(Exception):
    """A request the API server refused or did not answer; the controller retries later.
    ``detail`` is the server's own words (its Status answer's ``message``), "" if none."""

    def __init__(self, message: str, *, status: int = 0, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail

    @property
    def refused(self) -> bool:
        """The server understood the request and will not do it as asked (a quota, a policy,
        an invalid field, a denied permission): asking again the same way changes nothing until
        someone changes the cause. Not a conflict, a missing object, a timeout or too many
        requests, which are answered otherwise."""
        return 400 <= self.status < 500 and self.status not in (404, 408, 409, 429)


class Conflict(ApiFailure):
    """409: the object exists already, or changed since it was read."""


class Gone(ApiFailure):
    """404: the object (or its namespace) does not exist. ``named`` is the object the server's
    answer says it did not find (its ``details.name``), empty when the answer names none: a
    server still starting may answer 404 for a whole kind it does not serve yet."""

    def __init__(self, message: str, *, status: int = 404, named: str = "") -> None:
        super().__init__(message, status=status)
        self.named = named
