"""Machines a run creates and always deletes: provisioning, the intent ledger, slots, teardown, the sweeper.

See README.md here.
"""
