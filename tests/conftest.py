"""Settings of the test process itself (every test module sees them; the Ray nodes, jobs and
``raytpu demo`` subprocesses the tests start inherit them).

``NO_GCE_CHECK=true``: the tests never run on a Google Compute Engine VM, so Google's auth
library must not probe for a metadata server. Without it, building a ``gs://`` filesystem with
no GCS emulator in the environment (``workloads.storage.ray_train_storage``) waits ~13 s for
that probe to time out before it falls back to anonymous access. google-auth reads the variable
once, when it is first imported: hence here, before any test module is collected, and not in a
fixture.
"""

from __future__ import annotations

import os

os.environ.setdefault("NO_GCE_CHECK", "true")
