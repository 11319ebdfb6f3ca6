"""The ``Examples:`` of every help page, by the command's path as typed (``keelgate run``).

Why it exists: kubectl users read a command's examples before its flags, and the examples of
every command read best side by side (one spelling of a run, a namespace, a file). Each entry is
laid-out text, kept within 80 columns, shown by ``keelgate.cli.help`` (and by ``keelgate step``'s
own parser) right after the usage. Pure data: a step pod imports it without typer or rich.
"""

from __future__ import annotations

#: Exit codes, as ``keelgate --help`` lists them: the codes of ``keelgate.errors``, in the words
#: of README.md's table (tests/test_cli_first_hour.py holds the three to one list).
EXIT_CODES = """\
Exit codes:
  0    goal met (status: succeeded)
  1    failed (audit: the chain does not verify)
  2    bad input: one line naming the field or flag (your own tool code that
       will not import: its file and line)
  3    resumable: a stop to act on (budget, outcome unknown, approval); a model
       server that could not be reached (run the same command again); a run
       with no stop whose process is gone (resume continues it)
  4    busy: another process drives the run now, or --not-executed came before
       the call's write deadline
  5    the store cannot be opened or reached (keelgate temporal: the Temporal
       server): nothing was read or written, run the same command again
  6    fenced: another holder took the run over; this process's write under its
       old epoch was refused and nothing was written
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM): nothing saved is lost"""

_KEELGATE = {
    "keelgate": """\
Examples:
  # Run a manifest in this process, then see where it stands
  keelgate run -f examples/restock/agentrun.yaml
  keelgate status restock

  # Set up completion for bash (zsh, fish: the same)
  source <(keelgate completion bash)""",
    "keelgate run": """\
Examples:
  # Run a manifest; run it again with the same store to resume it
  keelgate run -f examples/restock/agentrun.yaml

  # From standard input, for a script (one JSON object on stdout)
  cat agentrun.yaml | keelgate run -f - -o json

  # On a shared PostgreSQL store
  keelgate run -f agentrun.yaml --store postgresql://keelgate@db/keelgate""",
    "keelgate resume": """\
Examples:
  # Continue a run from its last checkpoint
  keelgate resume restock

  # Raise its budgets to new totals (not increments) and continue
  keelgate resume restock --tokens 100000 --max-iterations 20""",
    "keelgate reconcile": """\
Examples:
  # The shop took the order: record the unknown outcome as done
  keelgate reconcile restock 2:0 --executed --by alice

  # It did not: abandon it (never sent again under its key)
  keelgate reconcile restock 2:0 --not-executed --by alice""",
    "keelgate approve": """\
Examples:
  # Let the action run, then continue the run
  keelgate approve restock-approved 2:0 --approve --by bob
  keelgate resume restock-approved

  # Never run it (the model is told)
  keelgate approve restock-approved 2:0 --deny --by bob""",
    "keelgate audit": """\
Examples:
  # The trail, every link checked (exit 1 naming the event if broken)
  keelgate audit restock --verify

  # Also against the heads an operator signed
  keelgate audit restock -n shop --verify --key operator.pub

Commands:
  keelgate audit export RUN --sign-key KEY [--output-file FILE]
      the chain as a signed in-toto Statement in a DSSE envelope
  keelgate audit verify FILE --key PUB
      check an exported chain offline, with no store""",
    "keelgate audit export": """\
Examples:
  # Sign the run's chain for an auditor
  keelgate audit export restock --sign-key key.pem --output-file restock.dsse.json

  # To stdout (the envelope alone)
  keelgate audit export restock -n shop --sign-key key.pem > restock.dsse.json""",
    "keelgate audit verify": """\
Examples:
  # With only the file and the public key: exit 0 verified, 1 not
  keelgate audit verify restock.dsse.json --key key.pub

  # From standard input, as JSON
  keelgate audit verify - --key key.pub -o json < restock.dsse.json""",
    "keelgate runs": """\
Examples:
  # Every run in the store
  keelgate runs

  # One namespace, with budget columns; names for a script
  keelgate runs -n shop -o wide
  keelgate runs -o name | xargs -n1 keelgate status""",
    "keelgate status": """\
Examples:
  # Where a run stands and what to type next
  keelgate status restock

  # For a script: one JSON object; exit 4 while another process drives it
  keelgate status restock -n shop -o json""",
    "keelgate step": """\
Examples:
  # What the operator's step pods run (the store URL from a Secret)
  KEELGATE_STORE=postgresql://... keelgate step -n shop --run restock""",
    "keelgate operator": """\
Examples:
  # The operator, watching every namespace (its pod's usual command)
  keelgate operator --store postgresql://keelgate-operator@db/keelgate

  # Two replicas, one leading
  keelgate operator --leader-elect --store postgresql://...""",
    "keelgate completion": """\
Examples:
  # For this shell
  source <(keelgate completion bash)

  # For every new zsh
  keelgate completion zsh > "${fpath[1]}/_keelgate\"""",
    "keelgate temporal-worker": """\
Examples:
  # A worker on the queue, against the store it drives runs on
  keelgate temporal-worker --task-queue keelgate --store postgresql://...""",
    "keelgate temporal run": """\
Examples:
  # Start the run's workflow (or find it) and wait for its next stop
  keelgate temporal run -f agentrun.yaml --task-queue keelgate""",
    "keelgate temporal resume": """\
Examples:
  # Raise a budget and let the workflow continue
  keelgate temporal resume restock -n shop --tokens 100000""",
    "keelgate temporal reconcile": """\
Examples:
  # Settle an unknown outcome; wait for the run's next stop
  keelgate temporal reconcile restock 2:0 --executed --by alice --wait""",
    "keelgate temporal approve": """\
Examples:
  # Approve an action; the workflow continues the run
  keelgate temporal approve restock 2:0 --approve --by bob""",
    "keelgate temporal status": """\
Examples:
  # Where a run driven through Temporal stands
  keelgate temporal status restock -n shop""",
    "keelgate tenant add": """\
Examples:
  # A role and a database of its own for namespace shop, its URL in the Secret
  keelgate tenant add shop --store postgresql://admin@db/keelgate

  # The operator's role, in the operator's namespace
  keelgate tenant add keelgate-system --operator --store postgresql://...""",
    "keelgate tenant move": """\
Examples:
  # shop, from an install where tenants share one database, into its own
  kubectl scale deployment keelgate-operator -n keelgate-system --replicas=0
  keelgate tenant move shop --store postgresql://admin@db/keelgate""",
    "keelgate tenant remove": """\
Examples:
  # Take shop's role away (its runs and trails stay in the store)
  keelgate tenant remove shop --store postgresql://admin@db/keelgate""",
    "keelgate tenant list": """\
Examples:
  # The roles and their databases, and the tenants with runs but no role (after an
  # upgrade, this also migrates every tenant's database)
  keelgate tenant list --store postgresql://admin@db/keelgate""",
}

_PLUGIN = {
    "kubectl keelgate": """\
Examples:
  # What waits for a person, everywhere you may look
  kubectl keelgate pending -A

  # Where a run stands, and what to type next
  kubectl keelgate status restock -n shop""",
    "kubectl keelgate status": """\
Examples:
  # The run as a tree: conditions, step pod, decisions, what to run next
  kubectl keelgate status restock -n shop

  # For a script
  kubectl keelgate status restock -n shop -o json""",
    "kubectl keelgate reconcile": """\
Examples:
  # You checked the shop: the order was placed
  kubectl keelgate reconcile restock 1:0 --executed -n shop

  # It was not, with a note for the audit trail's readers
  kubectl keelgate reconcile restock 1:0 --not-executed --note "no order" -n shop""",
    "kubectl keelgate approve": """\
Examples:
  # Let the action run (spec.by is you, as the API server says)
  kubectl keelgate approve payout 1:0 --approve -n finance

  # Never run it
  kubectl keelgate approve payout 1:0 --deny -n finance""",
    "kubectl keelgate resume": """\
Examples:
  # Raise the token budget in spec; the operator resumes the run
  kubectl keelgate resume restock --tokens 100000 -n shop""",
    "kubectl keelgate logs": """\
Examples:
  # Every step pod's log, in order
  kubectl keelgate logs restock -n shop

  # Follow the run until it is at rest
  kubectl keelgate logs restock -n shop -f""",
    "kubectl keelgate audit": """\
Examples:
  # The trail, from the operator's store (reached through a port-forward)
  KEELGATE_STORE=postgresql://... kubectl keelgate audit restock -n shop --verify

Commands:
  kubectl keelgate audit export RUN --sign-key-secret NAME --store URL
      the chain signed with a key kept in a Secret
  kubectl keelgate audit verify FILE --key PUB
      check an exported chain offline""",
    "kubectl keelgate audit export": """\
Examples:
  # Signed with the key in the Secret audit-key of the run's namespace
  kubectl keelgate audit export restock -n shop --sign-key-secret audit-key \\
      --store postgresql://... --output-file restock.dsse.json""",
    "kubectl keelgate audit verify": """\
Examples:
  # Offline: no cluster and no store are asked
  kubectl keelgate audit verify restock.dsse.json --key key.pub""",
    "kubectl keelgate list": """\
Examples:
  # The runs in the context's namespace, then everywhere with budgets
  kubectl keelgate list
  kubectl keelgate list -A -o wide""",
    "kubectl keelgate pending": """\
Examples:
  # What waits for you, oldest first, with the command that decides it
  kubectl keelgate pending -A

  # For a script
  kubectl keelgate pending -n shop -o json""",
    "kubectl keelgate ui": """\
Examples:
  # The decision inbox on 127.0.0.1, acting as you
  kubectl keelgate ui""",
}

EXAMPLES: dict[str, str] = {**_KEELGATE, **_PLUGIN}
