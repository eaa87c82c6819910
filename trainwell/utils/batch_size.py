"""``find_executable_batch_size``: the reference's decorator that retries a function with a smaller batch size.

With ``auto_find_batch_size=True`` the function runs under Accelerate's decorator of that name (on an
out-of-memory error it is called again with a smaller batch size); otherwise it is simply called with
``batch_size=starting_batch_size``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def find_executable_batch_size(
    function: Callable[..., Any] | None = None, starting_batch_size: int = 128, auto_find_batch_size: bool = False
) -> Any:
    """Decorate ``function(batch_size, ...)``; usable bare or with arguments, as in the reference."""
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 auto_find_batch_size=auto_find_batch_size)
    if auto_find_batch_size:
        from accelerate.utils import find_executable_batch_size as accelerate_search

        return accelerate_search(function=function, starting_batch_size=starting_batch_size)
    return functools.partial(function, batch_size=starting_batch_size)
