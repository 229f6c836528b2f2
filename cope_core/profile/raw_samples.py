"""The raw-samples file of ``cope profile --raw-samples`` (docs/formats.md#raw-samples-raw-samples):
every timing behind a measured profile's medians, by row key. ``cope predict --raw-samples``
reads it back to draw each row from its own samples.

The file is JSON, ``{"key": KEY_FORMAT, "samples_us": {row key: [µs, ...]}}``, a row key being
the row's :class:`~cope_core.profile.data.ProfileKey` columns, its CPU threads and GPU share
joined with ``|`` (:func:`raw_key`).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import CopeInputError
from ..files import json_text, write_atomic
from .data import ProfileKey

#: The columns a row key joins, in order.
KEY_FIELDS = (*ProfileKey._fields, "cpu_threads", "gpu_share")
KEY_FORMAT = "|".join(KEY_FIELDS)


def raw_key(key: Sequence, threads: int, share: float) -> str:
    """The row key of one profile row (its :class:`ProfileKey` columns) at an operating point."""
    if len(key) != len(ProfileKey._fields):
        raise ValueError(f"raw_key: expected the {len(ProfileKey._fields)} ProfileKey columns, "
                         f"got {len(key)}")
    return "|".join(map(str, (*key, threads, float(share))))


def write_raw_samples(path: str | os.PathLike, samples: Mapping[str, Sequence[float]], *,
                      overwrite: bool = False) -> None:
    """Write the samples by row key (:func:`raw_key`) as the raw-samples file, atomically (an
    existing file needs ``overwrite``)."""
    body = {"key": KEY_FORMAT, "samples_us": {k: [float(v) for v in vals]
                                              for k, vals in samples.items()}}
    write_atomic(path, json_text(body, indent=None), overwrite=overwrite)


def read_raw_samples(path: str | os.PathLike) -> dict[str, list[float]]:
    """The raw samples ``cope profile --raw-samples`` wrote: row key -> samples in microseconds.

    Parameters
    ----------
    path : path
        The JSON file.

    Returns
    -------
    dict
        Row key (:func:`raw_key`) -> the row's samples in microseconds.

    Raises
    ------
    CopeInputError
        One line naming the file and field, for a missing, unreadable or malformed file.
    """
    path = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise CopeInputError("file not found", source=path) from None
    except (OSError, ValueError) as exc:
        raise CopeInputError(f"not a readable JSON file ({' '.join(str(exc).split())[:120]})",
                             source=path) from None
    samples = data.get("samples_us") if isinstance(data, dict) else None
    if not isinstance(samples, dict):
        raise CopeInputError("expected a JSON object with a 'samples_us' object (written by "
                             "cope profile --raw-samples)", source=path, field="samples_us")
    if data.get("key", KEY_FORMAT) != KEY_FORMAT:
        raise CopeInputError(f"expected {KEY_FORMAT!r}, got {data.get('key')!r}", source=path,
                             field="key")
    out = {}
    for key, vals in samples.items():
        if not isinstance(vals, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
                and v >= 0 for v in vals):
            raise CopeInputError(f"row {key!r}: expected a list of finite numbers >= 0",
                                 source=path, field="samples_us")
        out[str(key)] = [float(v) for v in vals]
    return out
