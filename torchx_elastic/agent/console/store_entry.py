"""What the console's exchanges over the rendezvous store (the job's progress, its first
failure) may meet there: an entry that is not the job's.

The signed store (``rendezvous/signed_store.py``, above the console) raises
:class:`RefusedEntry` for a value it cannot verify with the job's secret; the console only
catches it, so the type lives here, below both.
"""

from __future__ import annotations


class RefusedEntry(ValueError):
    """A store entry that is not signed with this job's secret."""
