"""Files crafted to run code when unpickled, for the tests that check a checkpoint never does."""

from __future__ import annotations

from pathlib import Path


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears if the code runs."""

    def __init__(self, marker: Path | str):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))
