"""``python -m keelgate.cli.plugin``: the plugin without its console script.

Why it exists: the krew archive's launcher (deploy/krew) starts the plugin from a virtual
environment it may have moved into place, where a console script's absolute shebang would point
at the old path. It must never do more than ``kubectl-keelgate`` does.
"""

from keelgate.cli.plugin import run

run()
