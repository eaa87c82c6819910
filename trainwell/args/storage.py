"""Where a run lives: ``output_dir`` as a local folder or an object-store URL, and the run's local folder.

Owns what can be known of an ``output_dir`` URL without the network: its scheme (``s3://``, ``gs://``, ``az://``
and ``abfs://``, ``file://``), whether ``fsspec`` and the scheme's own package are installed (the error names the
extra to install), the refusal of ``save_on_each_node=True`` with a URL, and the **staging folder**: the local
folder a run whose ``output_dir`` is a URL writes everything into first. Checkpoints are staged there and uploaded
(``trainwell.checkpoint.store``); the logs, the live log, ``trainer_state.json``, the lock and the final
``save_model()`` stay there (and the final model is uploaded too). :func:`local_output_dir` is the one place that
says which local folder a run writes into: ``output_dir`` itself, or its staging folder.

The staging folder is ``output_staging_dir`` when set, else ``trainwell_staging/{scheme}/{bucket}/{path}`` under
the working directory (``$TRAINWELL_STAGING_DIR`` replaces ``trainwell_staging``): the same URL gives the same
folder, so a restart on the same machine finds its staged checkpoints.

``output_dir`` itself is kept as the user gave it (the URL): ``to_dict``, ``training_args.json`` and the parsers
see that string. ``storage_options`` (credentials, endpoint) go to fsspec and are never written or printed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Any

#: scheme -> (the package fsspec needs for it, the extra that installs it)
SCHEMES: dict[str, tuple[str | None, str]] = {
    "s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"),
    "file": (None, "storage"),
}
STAGING_ENV = "TRAINWELL_STAGING_DIR"
HIDDEN = "<HIDDEN>"  #: what ``to_dict`` shows of each ``storage_options`` value


def hide_options(serialized: dict[str, Any]) -> dict[str, Any]:
    """``serialized`` (``TrainingArguments.to_dict``'s output) with each ``storage_options`` value replaced by
    :data:`HIDDEN`: credentials are never written or printed, their keys still say what was set."""
    if serialized.get("storage_options"):
        serialized["storage_options"] = {key: HIDDEN for key in serialized["storage_options"]}
    return serialized
STAGING_DEFAULT = "trainwell_staging"

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def url_scheme(path: Any) -> str | None:
    """The scheme of ``path`` when it is a URL (``s3`` of ``s3://bucket/run``), lower-cased; None for a path."""
    match = _URL.match(path) if isinstance(path, str) else None
    return match.group(1).lower() if match else None


def is_url(path: Any) -> bool:
    return url_scheme(path) is not None


def check_url(url: str, what: str = "output_dir") -> None:
    """Refuse a URL trainwell cannot write checkpoints to, before any work: an unknown scheme, a URL without a
    bucket or path, ``fsspec`` or the scheme's package missing (naming the extra to install)."""
    scheme = url_scheme(url)
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in ("s3", "gs", "az", "abfs", "file"))
        raise ValueError(f"{what}={url!r}: trainwell writes runs to a local folder or to a {known} URL, not to "
                         f"{scheme}:// URLs. Pass one of those, or a local path.")
    rest = _URL.match(url).group(2).strip("/")
    if not rest:
        raise ValueError(f"{what}={url!r} names no {'folder' if scheme == 'file' else 'bucket'}: pass "
                         f"{scheme}://{'/path/to/run' if scheme == 'file' else 'bucket/path/to/run'}.")
    package, extra = SCHEMES[scheme]
    for needed in ("fsspec", package):
        if needed is not None and importlib.util.find_spec(needed) is None:
            raise ImportError(f"{what}={url!r} needs the {needed!r} package, which is not installed: "
                              f"pip install 'trainwell[{extra}]' (or pip install {needed}).")


def staging_dir_for(url: str) -> str:
    """The default staging folder of ``url``: ``trainwell_staging/{scheme}/{bucket}/{path}`` under the working
    directory (``$TRAINWELL_STAGING_DIR`` in place of ``trainwell_staging``)."""
    scheme = url_scheme(url) or "file"
    rest = _URL.match(url).group(2) if is_url(url) else url
    parts = [p for p in rest.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    root = os.path.expanduser(os.environ.get(STAGING_ENV) or STAGING_DEFAULT)
    return os.path.join(root, scheme, *parts)


def local_output_dir(args: Any) -> str:
    """The local folder a run with ``args`` writes into: ``output_dir``, or its staging folder when it is a URL."""
    output_dir = getattr(args, "output_dir", None)
    if not is_url(output_dir):
        return output_dir
    return getattr(args, "output_staging_dir", None) or staging_dir_for(output_dir)


def normalize_storage(args: Any) -> None:
    """``storage_options`` from a JSON object string (the command line's form); ``output_staging_dir``'s ``~``."""
    options = getattr(args, "storage_options", None)
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError:
            options = None
        if not isinstance(options, dict):  # the string itself may hold a secret: never quoted
            raise ValueError("storage_options: pass a dict or a JSON object string such as "
                             "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}' (the value given is not one).")
        args.storage_options = options
    if isinstance(options, dict) and HIDDEN in options.values():
        # to_dict() writes HIDDEN in place of each value: reading such a dump back must not send it as a credential
        args.storage_options = {k: v for k, v in options.items() if v != HIDDEN} or None
    elif options is not None and not isinstance(options, dict):
        raise ValueError(f"storage_options={options!r}: pass a dict or a JSON object string (fsspec's options for "
                         "the store: credentials, endpoint_url, ...).")
    staging = getattr(args, "output_staging_dir", None)
    if isinstance(staging, os.PathLike):
        staging = os.fspath(staging)
    if isinstance(staging, str) and staging:
        args.output_staging_dir = os.path.expanduser(staging)


def check_storage_args(args: Any) -> None:
    """The cross-field checks of a URL ``output_dir`` (and of a URL ``resume_from_checkpoint``)."""
    url = args.output_dir
    resume = getattr(args, "resume_from_checkpoint", None)
    if is_url(resume):
        check_url(resume, "resume_from_checkpoint")
    if not is_url(url):
        if getattr(args, "output_staging_dir", None) is not None:
            raise ValueError(f"output_staging_dir={args.output_staging_dir!r} is for a run whose output_dir is a URL; "
                             f"output_dir={url!r} is a local folder already. Leave output_staging_dir unset.")
        if getattr(args, "storage_options", None) and not is_url(resume):  # keys only: the values may be secrets
            raise ValueError(f"storage_options (keys {sorted(args.storage_options)}) is for an object store, and "
                             f"output_dir={url!r} is a local folder: nothing would use it. Leave storage_options "
                             "unset, or make output_dir an s3://, gs://, az:// or file:// URL.")
        return
    check_url(url)
    if args.save_on_each_node:
        raise ValueError(f"save_on_each_node=True with output_dir={url!r}: every node would upload the same "
                         "checkpoint into the same place. Set save_on_each_node=False: process 0 uploads, and on a "
                         "resume every process downloads what it reads from the store.")
    staging = getattr(args, "output_staging_dir", None)
    if staging is not None and (not isinstance(staging, str) or is_url(staging) or not staging):
        raise ValueError(f"output_staging_dir={staging!r}: pass a local folder path (checkpoints are staged there "
                         "before they are uploaded), or leave it unset for trainwell_staging/... in the working "
                         "directory.")
