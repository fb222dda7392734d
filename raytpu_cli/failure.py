"""How every ``raytpu`` command reports a failure: the error class, its code, its exit code.

The exit code comes from the error taxonomy (:mod:`raytpu.errors`): 2 bad input, 3 scheduling
(no capacity, partial slice, mis-sized request), 4 runtime (model/XLA error, NaN), 5 network
timeout, 6 upstream rate limit (429), 1 anything else. The printed line names the class, so a
run summary says which layer failed:

    error [RTPU-S03 scheduling_missized_request]: could not reserve 1 x v6e 2x4 ...
"""

from __future__ import annotations

import sys
from typing import TextIO

from raytpu import errors


def report(error: BaseException, *, stream: TextIO | None = None) -> int:
    """Print ``error`` with its class on stderr; return the class's exit code."""
    error_class = errors.classify(error)
    message = str(error)
    if message.startswith(error_class.tag):
        message = message[len(error_class.tag) :].lstrip()
    print(f"error {error_class.tag}: {message}", file=stream or sys.stderr)
    return error_class.exit_code
