"""The local cloud: Google's TPU v2/v2alpha1 and Compute Engine v1 REST APIs, a GCS emulator and
machine processes on 127.0.0.1, so the real google-cloud clients can be tested end to end.

Start it with `python -m interlude_localcloud` or, in tests, `interlude_localcloud.testing.running_localcloud`.
"""
