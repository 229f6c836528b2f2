"""The sidebar's "Your machine" (Streamlit layer): the GPU, CPU, memory and link chosen from the
parts catalog and the weights of a catalog model, kept in the session's settings and the URL
(``gpu``, ``cpu``, ``memory``, ``pcie``, ``quant``: the CLI's spelling of a machine), and what
they make of the inputs every page shows: a catalog model without a shipped example gets a
SYNTHETIC trace made here (cached), and a chosen machine replaces the profile by the ANALYTIC one
of the composed machine (cached); a machine without a GPU ("no GPU") keeps the profile and every
page answers for the CPU alone (:func:`no_gpu_page`). The pure logic is :mod:`.machine_choice`
and :mod:`.no_gpu`."""
from __future__ import annotations

import dataclasses
import hashlib
import re
import tempfile
from pathlib import Path
from typing import NamedTuple

import streamlit as st

from .. import parts
from ..errors import CopeInputError
from ..files import write_atomic
from ..geometry import CATALOG, DEFAULT_CONTEXT, ModelGeometry
from ..llamacpp import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, LATEST_BUILD, Request
from ..platforms import DEFAULT_CPU, platform_spec
from ..profile.analytic import analytic_for_model, analytic_profile
from ..profile.data import Profile
from ..trace.data import Trace
from ..trace.synth_defaults import synthetic_inputs
from . import machine_choice as mc
from . import no_gpu
from .dataset import Dataset, file_names
from .url_state import bound, resolve, settings

#: The GPU of a catalog model's profile when no machine is chosen (as the shipped examples').
DEFAULT_GPU = "rtx4090"
#: The longest context the sidebar takes (tokens).
MAX_CONTEXT = 1 << 20
#: The machine the session's budget and operating point were chosen for.
_SET_FOR = "cope_machine_settings_for"
#: This session's parts read from part files: {"gpu": GpuPart, "cpu": CpuPart}.
_OWN = "cope_own_parts"
_PART_DIR = Path(tempfile.gettempdir()) / "cope-app-parts"


def sidebar_weights(model: str | None) -> None:
    """The weights chooser, for a model whose geometry is a catalog entry's."""
    if model not in CATALOG:
        return
    opts = mc.quant_options(model)
    bound("quant", st.sidebar.selectbox, default=mc.AS_IS, valid=lambda v: v in opts,
          label="Weights", options=opts,
          format_func=lambda v: "as the catalog has it (BF16)" if v == mc.AS_IS else v,
          help="The llama-quantize preset of the file you run (`cope models` lists each "
               "preset's expert size): the routing stays, every byte and cost is priced anew.")


def sidebar() -> None:
    """GPU, CPU, memory and link from the parts catalog (docs/parts.md)."""
    st.sidebar.subheader("Your machine")
    own = _own_parts()
    gpus = mc.gpu_options(own.gpu)
    gpu = bound("gpu", st.sidebar.selectbox, default=mc.EXAMPLE, valid=lambda v: v in gpus,
                label="GPU", options=gpus,
                format_func=lambda v: mc.gpu_label(v, own.gpu),
                help="Choose yours: every page then prices an ANALYTIC what-if of the machine "
                     "these parts make (published numbers, `cope parts`), not the example's "
                     "profile. \"no GPU\": every weight and operation on the CPU.")
    _build_choice()
    _request_choice()
    if gpu == mc.EXAMPLE:
        _part_upload()
        _new_machine()
        return
    cpus = mc.cpu_options(own.cpu)
    cpu = bound("cpu", st.sidebar.selectbox, default=DEFAULT_CPU, valid=lambda v: v in cpus,
                label="CPU", options=cpus,
                format_func=lambda v: mc.cpu_label(v, own.cpu),
                help="Threads run on its physical cores (a hybrid CPU's P-cores).")
    mems = mc.memory_options()
    usual = own.usual_memory(cpu)
    bound("memory", st.sidebar.selectbox, default=mc.DEFAULT, valid=lambda v: v in mems,
          label="Memory", options=mems, format_func=lambda v: mc.memory_label(v, usual),
          help="type-MT/s x channels: the host memory the CPU's experts are read from")
    if gpu == mc.NO_GPU:                # no slot, and no VRAM for a context to take from
        st.sidebar.caption("No GPU: every weight is read from this memory on each token.")
        _part_upload()
        _new_machine()
        return
    links = mc.link_options()
    card = own.gpu if gpu == mc.FILE and own.gpu else parts.gpus()[gpu]
    bound("pcie", st.sidebar.selectbox, default=mc.DEFAULT, valid=lambda v: v in links,
          label="GPU slot", options=links, format_func=lambda v: mc.link_label(v, card),
          help="The slot's PCIe generation x lanes; the card runs at the lower of the two.")
    more = bound("more", st.sidebar.text_input, default="", valid=lambda v: isinstance(v, str),
                 label="More cards", placeholder="e.g. rtx3090,rtx3060-12gb",
                 help="The cards beside this one, in llama.cpp's device order (catalog names, "
                      "comma-separated; `cope advise --gpu a,b`): the Overview then places "
                      "llama.cpp across them (-ts and -ot) against --fit and one card.")
    try:
        mc.more_cards(more)
    except CopeInputError as exc:
        st.sidebar.error(str(exc))
    bound("ctx", st.sidebar.number_input, default=DEFAULT_CONTEXT,
          valid=lambda v: isinstance(v, int) and 1 <= v <= MAX_CONTEXT, coerce=int,
          label="Context length (tokens)", min_value=1, max_value=MAX_CONTEXT, step=1024,
          help="The KV cache your runtime holds: a longer context leaves less of the card to "
               "experts (the default budget is your card less what it adds beyond 4096).")
    _part_upload()
    _new_machine()


def _build_choice() -> None:
    builds = mc.build_options()
    bound("llamacpp", st.sidebar.selectbox, default=LATEST_BUILD, valid=lambda v: v in builds,
          label="llama.cpp build", options=builds, format_func=mc.build_label,
          help="The llama.cpp you run (`llama-server --version`; `cope advise --llamacpp`): "
               "its llama.cpp answers use only the flags, MoE cache and default that build has.")


def _request_choice() -> None:
    st.sidebar.subheader("Your request")
    c1, c2 = st.sidebar.columns(2)
    with c1:
        bound("ptok", st.number_input, default=DEFAULT_PROMPT_TOKENS,
              valid=lambda v: isinstance(v, int) and 0 <= v <= MAX_CONTEXT, coerce=int,
              label="Prompt (tokens)", min_value=0, max_value=MAX_CONTEXT, step=1024,
              help="A chat turn, a coding agent's context, a RAG prompt: llama.cpp's answer is "
                   "ranked by the time to the first token plus the answer's decode, with -ub "
                   "searched beside --n-cpu-moe (`cope advise --prompt-tokens`). 0: decode "
                   "alone.")
    with c2:
        bound("gtok", st.number_input, default=DEFAULT_GEN_TOKENS,
              valid=lambda v: isinstance(v, int) and 1 <= v <= MAX_CONTEXT, coerce=int,
              label="Answer (tokens)", min_value=1, max_value=MAX_CONTEXT, step=128,
              help="Tokens decoded after the prompt (`--gen-tokens`).")
    bound("ramgib", st.sidebar.number_input, default=0, valid=_ram_ok, coerce=int,
          label="Host memory (GiB)", min_value=0, max_value=MAX_RAM_GIB, step=16,
          help="Your machine's RAM: llama.cpp's answer then also prices loading without mmap "
               "(--load-mode none), whose host experts stay pinned and copy faster to the GPU "
               "for a prompt, where they fit beside 4 GiB for the rest (`cope advise --ram-gib`). "
               "0: not known, not priced.")


#: the largest host memory the sidebar takes (GiB)
MAX_RAM_GIB = 4096


def _ram_ok(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_RAM_GIB


def host_ram() -> float | None:
    """The host memory chosen in the sidebar, GiB (None: not given, 0)."""
    v = resolve("ramgib", 0, _ram_ok, int)
    return float(v) if v else None


def request() -> Request | None:
    """The request chosen in the sidebar (a 4,096 + 512 chat turn unless one was; None: the
    prompt set to 0, decode alone)."""
    prompt = resolve("ptok", DEFAULT_PROMPT_TOKENS,
                     lambda v: isinstance(v, int) and 0 <= v <= MAX_CONTEXT, int)
    gen = resolve("gtok", DEFAULT_GEN_TOKENS,
                  lambda v: isinstance(v, int) and 1 <= v <= MAX_CONTEXT, int)
    return None if prompt == 0 else Request(prompt, gen)


def llamacpp_build() -> str:
    """The llama.cpp build chosen in the sidebar (``latest`` unless one was)."""
    return resolve("llamacpp", LATEST_BUILD, lambda v: v in mc.build_options())


def _own_parts() -> mc.OwnParts:
    return st.session_state.get(_OWN) or mc.OwnParts()


def _part_upload() -> None:
    """A GPU or CPU the catalog lacks, from a part file with its data sheet's numbers
    (docs/parts.md): offered as "your part file" in its chooser, for this session (a link does
    not carry the file; opened elsewhere it falls back to the default)."""
    with st.sidebar.expander("A part the catalog lacks"):
        f = st.file_uploader("GPU or CPU part file (JSON or TOML, docs/parts.md)",
                             type=["json", "toml"], key="_up_part")
        if f is None:
            return
        try:
            part = read_part_upload(f.name, f.getvalue())
        except CopeInputError as exc:
            st.error(file_names(str(exc)))          # never a path of the server
            return
        own = _own_parts()
        kind = "gpu" if isinstance(part, parts.GpuPart) else "cpu"
        new = (dataclasses.replace(own, gpu=part) if isinstance(part, parts.GpuPart)
               else dataclasses.replace(own, cpu=part))
        if new != own:
            st.session_state[_OWN] = new
            st.rerun()                              # the chooser above offers it
        st.caption(f"{part.label}: choose \"your part file\" as the {kind.upper()}")


def read_part_upload(name: str, data: bytes) -> parts.GpuPart | parts.CpuPart:
    """An uploaded part file, stored under a name made of its content's hash and read by
    :func:`cope_core.parts.read_part_file` (one-line CopeInputError when bad)."""
    if len(data) > 64 * 1024:
        raise CopeInputError("a part file is a few lines; this one is over 64 KiB",
                             source=f"upload {name}")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name)[:80] or "part.json"
    path = _PART_DIR / hashlib.sha256(data).hexdigest()[:24] / safe
    if not path.exists():
        write_atomic(path, data)
    part = parts.read_part_file(path)
    assert isinstance(part, parts.GpuPart | parts.CpuPart)
    return part


def _new_machine() -> None:
    """Another GPU or context gets its own default budget (all of the card, less the KV cache
    a longer context adds) and another machine its own operating point (the CPU's cores): the
    old ones were chosen for other hardware. The first run of a session keeps its link's."""
    m = choice()
    now = ((mc.part_name(m.gpu), m.context), m.parts_key) if m is not None \
        else ((mc.EXAMPLE, 0), mc.EXAMPLE)
    before = st.session_state.get(_SET_FOR)
    st.session_state[_SET_FOR] = now
    if before is None or before == now:
        return
    for name, changed in (("vram", before[0] != now[0]), ("op", True)):
        if changed:
            settings().pop(name, None)
            if name in st.query_params:
                del st.query_params[name]


def choice() -> mc.MachineChoice | None:
    """The machine chosen in the sidebar, or None (the example's own profile)."""
    own = _own_parts()
    gpu = resolve("gpu", mc.EXAMPLE, lambda v: v in mc.gpu_options(own.gpu))
    if gpu == mc.EXAMPLE:
        return None
    cpu = resolve("cpu", DEFAULT_CPU, lambda v: v in mc.cpu_options(own.cpu))
    mems, links = mc.memory_options(), mc.link_options()
    return mc.MachineChoice(gpu=own.gpu if gpu == mc.FILE and own.gpu else gpu,
                            cpu=own.cpu if cpu == mc.FILE and own.cpu else cpu,
                            memory=resolve("memory", mc.DEFAULT, lambda v: v in mems),
                            link=resolve("pcie", mc.DEFAULT, lambda v: v in links),
                            context=resolve("ctx", DEFAULT_CONTEXT,
                                            lambda v: 1 <= v <= MAX_CONTEXT, int),
                            more=() if gpu == mc.NO_GPU else
                            mc.more_cards(resolve("more", "", _cards_ok)))


def _cards_ok(v: object) -> bool:
    """A "More cards" setting that names catalog cards only (a bad one is shown as an error
    in the sidebar and the machine keeps one card)."""
    try:
        return isinstance(v, str) and mc.more_cards(v) is not None
    except CopeInputError:
        return False


def quant(model: str) -> str:
    return resolve("quant", mc.AS_IS, lambda v: v in mc.quant_options(model))


# --- cached inputs ------------------------------------------------------------------------------
@st.cache_data(show_spinner="Making a synthetic trace …", max_entries=8)
def synthetic(name: str, weights: str) -> tuple[Trace, Trace, Profile]:
    """A catalog model without a shipped example: its SYNTHETIC trace and calibration, made as
    the shipped examples' (:func:`cope_core.trace.synth_defaults.synthetic_inputs`), and the
    ANALYTIC profile the shipped examples have (on :data:`DEFAULT_GPU`)."""
    g = mc.catalog_geometry(name, weights)
    trace, cal = synthetic_inputs(g)
    return trace, cal, analytic_profile(g, platform_spec(DEFAULT_GPU))


@st.cache_resource(show_spinner=False, max_entries=16)
def _machine_profile(machine: str, model_key: str, _choice: mc.MachineChoice,
                     _g: ModelGeometry) -> Profile:
    return mc.machine_profile(_g, _choice.compose(), _choice.context)


@st.cache_resource(show_spinner=False, max_entries=16)
def _weights(model_key: str, weights: str, _trace: Trace, _cal: Trace | None,
             _profile: Profile) -> tuple[Trace, Trace | None, Profile]:
    g = mc.catalog_geometry(_trace.model.name, weights)
    return (_trace.with_model(g), _cal.with_model(g) if _cal is not None else None,
            analytic_for_model(_profile, g) if _profile.analytic else _profile)


class Inputs(NamedTuple):
    """The inputs after the sidebar's weights and machine: what :func:`apply` returns."""

    key: str
    trace: Trace
    calibration: Trace | None
    profile: Profile
    machine: bool       # the profile is the chosen machine's


def apply(key: str, trace: Trace, cal: Trace | None, profile: Profile,
          origin: dict[str, str]) -> Inputs:
    """Price the inputs in the chosen weights (a catalog model's trace) and on the chosen
    machine (its ANALYTIC profile replaces the profile); ``origin`` is updated in place."""
    g = trace.model
    weights = quant(g.name) if g.name in CATALOG and CATALOG[g.name] == g else mc.AS_IS
    if weights != mc.AS_IS:
        trace, cal, profile = _weights(key, weights, trace, cal, profile)
        key += f"|weights={weights}"
        origin["model"] = f"catalog {g.name} in {weights}"
    m = choice()
    if m is not None and m.cpu_only:      # no profile to make: the pages answer without one
        key += f"|machine={m.key}"
        origin["profile"] = "not used: no GPU, every operation priced on the CPU (ANALYTIC)"
    elif m is not None:
        profile = _machine_profile(m.key, key, m, trace.model)   # key: the inputs' files
        key += f"|machine={m.key}"
        origin["profile"] = f"your machine {profile.platform['machine']} (ANALYTIC, made here)"
    return Inputs(key, trace, cal, profile, m is not None)


def machine_note(profile: Profile) -> str | None:
    """What the pages say when a chosen machine replaced the example's profile."""
    plat = profile.platform or {}
    if not mc.is_your_machine(profile):
        return None
    ctx = f", a {plat['context']}-token context" if plat.get("context") != DEFAULT_CONTEXT else ""
    return (f"**Your machine: {plat['machine']}** ({plat['vram_gib']:g} GiB of GPU memory{ctx}) "
            "— an "
            "**ANALYTIC what-if**: every cost is computed from the parts' published numbers "
            "(docs/parts.md), not measured; the example's own profile is not used. Choose "
            "\"the example's own profile\" in the sidebar to go back.")


@st.cache_resource(show_spinner=False, max_entries=8)
def _cpu_only_advice(key: str, _trace: Trace, _cal: Trace | None,
                     _choice: mc.MachineChoice):
    return no_gpu.cpu_only_advice(_trace, _cal, _choice)


def no_gpu_page(title: str, ds: Dataset) -> None:
    """With "no GPU" chosen: what that means on this page and the CPU-only answer (``cope
    advise --gpu none``'s); the page stops here unless its content needs no GPU."""
    m = choice()
    if m is None or not m.cpu_only:
        return
    note, stops = no_gpu.page_note(title)
    st.info(note)
    try:
        advice = _cpu_only_advice(ds.key, ds.trace, ds.calibration, m)
    except CopeInputError as exc:
        st.error(file_names(str(exc)))
        st.stop()
    st.success(no_gpu.headline(advice))
    st.dataframe(no_gpu.answer_rows(advice), hide_index=True)
    st.caption(file_names(f"Costs: {advice.costs}. Routing: {advice.routing}. The same answer "
                          "without the app: `cope advise --model MODEL --gpu none --cpu CPU "
                          "--memory MEMORY`."))
    if stops:
        st.stop()
