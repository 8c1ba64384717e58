"""SequenceGroup: the requests one request of the caller's became inside a V0 core (vLLM V0's
name): its n samples, or its beams (beam_group.py), under the caller's request id."""

from __future__ import annotations

from minivllm.core.request import Request


class SequenceGroup:
    def __init__(self, first: Request, width: int):
        self.request_id = first.request_id    # the caller's
        self.first = first                    # the first sample (its metrics are the group's)
        self.seqs = [first]                   # its samples (beams) now
        self.width = width                    # n, or the beam width
        self.num_made = 1                     # samples made so far, forks included

    @property
    def num_unforked(self) -> int:
        """Samples still to fork: their slots under max_num_seqs are held from admission."""
        return max(0, self.width - self.num_made)

    def child_id(self, index: int) -> str:
        """Sample `index`'s request id: V1's child format, as the front end's ParentRequest."""
        return f"{index}_{self.request_id}"
