"""Files crafted to run code when unpickled, for the tests that check a checkpoint never does."""

from __future__ import annotations

from pathlib import Path


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears if the code runs."""

    def __init__(self, marker: Path | str):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def as_reference(folder: Path | str) -> None:
    """Make a trainwell checkpoint look as the reference writes one: no manifest, and no ``training_args.json``
    (the reference pickles its arguments into ``training_args.bin``), so nothing in it says a manifest was written
    and the checks behind the manifest are the ones left."""
    for name in ("checkpoint_manifest.json", "training_args.json"):
        (Path(folder) / name).unlink(missing_ok=True)


def reseal(folder: Path | str) -> None:
    """Rebuild a checkpoint's manifest after an edit: a checkpoint edited together with its manifest, which only
    the checks behind the manifest can catch."""
    from trainwell.checkpoint import manifest

    manifest.write(folder, manifest.build(folder, []))
