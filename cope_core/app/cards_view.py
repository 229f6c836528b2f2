"""Several cards on the Overview (the sidebar's "More cards"): llama.cpp's placement across the
chosen machine's cards, the one answer ``cope advise --gpu a,b`` prints
(:func:`cope_core.export.machine_devices`), as a table of devices and its sentences."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from ..errors import CopeInputError
from ..export import machine_devices
from ..geometry import ModelGeometry
from ..llamacpp import DevicesAnswer, llama_settings, parse_build
from . import machine_choice as mc


def device_rows(d: DevicesAnswer) -> pd.DataFrame:
    """One row per card: its blocks, how many keep their experts in host memory, and GiB."""
    rows = []
    for x in d.to_dict()["devices"]:
        b = x["blocks"]
        rows.append({"device": x["device"], "card": x["gpu"],
                     "blocks": f"{b[0]}-{b[-1]}" if b else "none (left out)",
                     "output": "yes" if x["output"] else "",
                     "experts in host memory": len(x["host_expert_blocks"]),
                     "GiB used": round(x["total_gib"], 2), "of GiB": round(x["budget_gib"], 2),
                     "weights": round(x["weights_gib"], 2), "KV cache": round(x["kv_gib"], 2),
                     "compute": round(x["compute_gib"], 2)})
    return pd.DataFrame(rows)


@st.cache_resource(show_spinner="Placing llama.cpp across the cards …", max_entries=8)
def _answer(key: str, _g: ModelGeometry, _choice: mc.MachineChoice, build: str,
            context: float) -> DevicesAnswer | None:
    llama = llama_settings(None, n_ctx=_choice.context, build=parse_build(build))
    return machine_devices(_g, _choice.compose(), vram_gib=None, context=context,
                           llama=llama, rel=0.0)


def show(key: str, g: ModelGeometry, choice: mc.MachineChoice | None, build: str,
         context: float) -> None:
    """The section, when the machine has more than one card."""
    if choice is None or choice.cpu_only or not choice.more:
        return
    st.subheader(f"llama.cpp across {1 + len(choice.more)} cards")
    try:
        d = _answer(f"{key}|{choice.key}|{build}|{context:g}", g, choice, build, context)
    except CopeInputError as exc:
        st.error(str(exc))
        return
    if d is None:
        st.error("No placement fits these cards: not even every routed expert in host memory "
                 "leaves room for the other weights, KV cache and compute buffers.")
        return
    st.code(d.flags().command(), language="bash")
    st.dataframe(device_rows(d), hide_index=True)
    for line in d.lines()[1:]:
        if not line.lstrip().startswith(tuple(d.names)):
            st.markdown("- " + line.strip())
    st.caption("Ranked by decode, each card's layers at its own rates and one measured "
               "hand-off per card boundary (docs/design.md#several-gpus); the same answer "
               "without the app: `cope advise --gpu " + ",".join(
                   (mc.part_name(choice.gpu), *choice.more)) + " ...`.")

