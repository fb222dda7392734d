"""Serving over Ray Serve: the app, its router, HTTP and request handling, the OpenAI API, the
fallback route and batching.
"""
