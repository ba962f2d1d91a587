"""A training stage on its machine: the state machine that watches it, and the policies it acts by.

See README.md here; :mod:`interlude.triggers.stage` runs the machine in the triggerer.
"""
