"""How one runtime of the llama.cpp family spells the flags :mod:`.command` writes: the
:class:`Dialect` record (its instances, mainline's and ik_llama.cpp's, are :mod:`.command`'s,
beside the tensor patterns they name)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """How one runtime of the llama.cpp family spells the flags written here (module
    docstring): its ``--n-cpu-moe``, what ``fit`` off and on write (and whether ``-fitt``
    exists), the explicit override of a set of blocks (``head`` + blocks + ``tail``), ``-ngl``
    for every layer, and the keys of :data:`.command._ORDER` it has for ``server`` (None: all) and
    whether its llama-bench is written here."""

    name: str
    n_cpu_moe: str
    fit_off: tuple[str, ...]
    fit_on: tuple[str, ...]
    fit_margin: bool
    ot_head: str
    ot_tail: str
    every_layer: int
    keys: tuple[str, ...] | None = None
    bench: bool = True
