"""Keelgate's Kubernetes floor: the CRDs generated from the manifest models, and (later) the
kopf handlers, step pods and status mirroring.

It may import ``keelgate.manifest`` and ``keelgate.core``; nothing below it may import this
package, and importing it must never contact a cluster.
"""
