"""torch's c10d rendezvous backend with a signed state: nothing unverified is unpickled.

torch's dynamic rendezvous keeps its state as a pickle under ``torch.rendezvous.<run id>``
in the store and ``pickle.loads`` whatever it finds there on every sync: a process that can
write the store runs code in every agent. :class:`SignedRendezvousBackend` is a
``RendezvousBackend`` (torch's public interface) around torch's own c10d backend that signs
each state it writes with the job's secret and a sequence number, and hands torch only a
state it verified and that is not older than one it has seen (a replayed state). What it
refuses is reported once and replaced by the last verified state; the token of the refused
entry goes with it, so the next write of any agent overwrites the forged entry. Where the state
is not rewritten in steady state (the keyed liveness), :meth:`SignedRendezvousBackend.repair`
writes the last verified state back over a refused one as soon as it is found.
"""

from __future__ import annotations

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner

_SEQ_BYTES = 8


class SignedRendezvousBackend(RendezvousBackend):
    def __init__(self, backend: RendezvousBackend, signer: StoreSigner, run_id: str) -> None:
        self._backend = backend
        self._signer = signer
        self._key = f"torch.rendezvous.{run_id}"  # what torch's c10d backend writes to
        self._seq = 0  # of the newest verified state
        self._last_state: bytes | None = None
        self._refused_token: Token = None
        self._refused = False  # the last state read was refused

    @property
    def name(self) -> str:
        return self._backend.name

    def get_state(self) -> tuple[bytes, Token] | None:
        return self._verified(self._backend.get_state())

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        if token is None and self._refused_token is not None:
            token = self._refused_token  # overwrite the refused entry
        blob = self._signer.seal(self._key, (self._seq + 1).to_bytes(_SEQ_BYTES, "big") + state)
        result = self._backend.set_state(blob, token)
        if result is None:
            return None
        written, new_token, has_set = result
        verified = self._verified((written, new_token))
        if verified is None:
            return None
        new_state, new_token = verified
        return new_state, new_token, has_set and new_state == state

    def repair(self) -> bool:
        """Reads the state; where it refuses what it read (forged, replayed), writes the last
        state it verified back over it (a compare-and-set from the refused bytes, signed with
        the next sequence number). Whether it wrote: False where the state verified, where
        this node verified none yet, or where another write came first."""
        self.get_state()
        if not self._refused or self._last_state is None:
            return False
        result = self.set_state(self._last_state, self._refused_token)
        return result is not None and result[2]

    def _verified(self, result: tuple[bytes, Token] | None) -> tuple[bytes, Token] | None:
        if result is None:
            if self._seq == 0:
                return None  # no state yet
            # the entry was reset to "no state" by someone outside the job
            return self._refuse(b"", None, "it was emptied")
        blob, token = result
        try:
            payload = self._signer.open(self._key, blob)
        except RefusedEntry as err:
            return self._refuse(blob, token, str(err))
        seq = int.from_bytes(payload[:_SEQ_BYTES], "big")
        if len(payload) < _SEQ_BYTES or seq < self._seq:
            return self._refuse(blob, token, f"an older state (#{seq}, newest #{self._seq})")
        self._seq, self._last_state, self._refused_token = seq, payload[_SEQ_BYTES:], None
        self._refused = False
        return self._last_state, token

    def _refuse(self, blob: bytes, token: Token, reason: str) -> tuple[bytes, Token] | None:
        self._signer.warn_refused(f"the rendezvous state {self._key!r}", reason, blob)
        self._refused_token, self._refused = token, True
        if self._last_state is None:
            return None
        return self._last_state, token
