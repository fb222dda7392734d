"""``workloads.serve:app``, the Serve import path of stack files and images: :mod:`workloads.serving.app`."""

from workloads.serving.app import app as app
