"""``--more-gpus`` on ``cope predict`` and ``cope export``: the cards beside the profile's, so
llama.cpp's answer is placed across them as ``cope advise --gpu a,b`` places it
(:func:`cope_core.export.profile_devices`; docs/cli.md#several-gpus)."""
from __future__ import annotations

import argparse

from .. import parts
from ..errors import CopeInputError
from ..export import profile_devices
from ..geometry import GIB, ModelGeometry
from ..llamacpp import DevicesAnswer
from ..platforms import PlatformSpec
from ..profile.data import Profile
from .args import request_settings


def add_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--more-gpus", metavar="A,B",
                   help="the cards beside the profile's GPU, catalog names or part files in "
                        "llama.cpp's device order: llama.cpp's answer is then placed across "
                        "them (-ts, -ot), against --fit on the same cards and the first card "
                        "alone (an ANALYTIC profile; the others in their own interface's slot)")


def cards_answer(args: argparse.Namespace, g: ModelGeometry, profile: Profile, *,
                 threads: int, context: float, vram_gib: float | None
                 ) -> DevicesAnswer | None:
    """The answer across the profile's card and ``--more-gpus``' (None when not given), at the
    profile's operating point ``threads`` and the trace's mean ``context``."""
    more = getattr(args, "more_gpus", None)
    if not more:
        return None
    names = [n.strip() for n in more.split(",") if n.strip()]
    spec = (profile.platform or {}).get("spec")
    if not profile.analytic or not isinstance(spec, dict):
        raise CopeInputError("places llama.cpp across cards from each card's peaks: give an "
                             "ANALYTIC profile (cope profile --analytic), not a measured one",
                             field="--more-gpus")
    first = PlatformSpec.from_dict(spec)
    settings = request_settings(args)
    llama = settings["llama"]
    if vram_gib is not None:
        first_bytes = vram_gib * GIB + llama.margin_bytes
    elif first.gpu_name in parts.gpus():
        first_bytes = parts.gpus()[first.gpu_name].memory_bytes
    else:
        raise CopeInputError(f"the profile's GPU {first.gpu_name!r} is not in the catalog: "
                             "give --vram-gib for its memory", field="--more-gpus")
    d = profile_devices(g, first, first_bytes, names, threads=threads, context=context,
                        llama=llama, rel=0.0, request=settings["request"])
    if d is None:
        raise CopeInputError("no placement fits these cards: not even every routed expert in "
                             "host memory leaves room for the rest", field="--more-gpus")
    return d
