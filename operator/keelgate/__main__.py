"""``python -m keelgate`` runs the command line, exactly as the ``keelgate`` executable does."""

from keelgate.cli import run

run()
