"""Small shared helpers. ``trainwell.utils.logging`` is imported here (it needs only the standard library) so
that ``import trainwell; trainwell.utils.logging.set_verbosity_info()`` works as with the reference."""

from trainwell.utils import logging  # noqa: F401
