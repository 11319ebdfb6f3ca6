"""``python -m keelgate.kube.crds``: write, check or print the CRDs (see ``files.main``)."""

from __future__ import annotations

import sys

from keelgate.kube.crds.files import main

sys.exit(main())
