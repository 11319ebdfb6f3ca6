"""The floor everything stands on: the loop, the gateway, budgets, audit chain, failpoints and the
protocols the stores implement. It must never import Kubernetes, kopf, HTTP clients or database
drivers."""
