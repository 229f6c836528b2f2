"""Settings kept in the URL query string (``st.query_params``), so that a view can be shared:
read once per session, written back as widgets change, bound to widgets with a default and a
validity check (the codecs are :mod:`.settings`, free of Streamlit)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from .settings import OLD_KEYS, format_setting, parse_query

_SETTINGS = "cope_settings"


def settings() -> dict[str, Any]:
    """This session's settings; the first run of a session reads them from the URL."""
    if _SETTINGS not in st.session_state:
        st.session_state[_SETTINGS] = parse_query(st.query_params.to_dict())
    return st.session_state[_SETTINGS]


def sync_url() -> None:
    """Write every setting to the query string (page switches may have cleared it); an old
    key the session was opened with is written under its new name only."""
    for old in OLD_KEYS:
        if old in st.query_params:
            del st.query_params[old]
    for name, value in settings().items():
        text = format_setting(name, value)
        if st.query_params.get(name) != text:
            st.query_params[name] = text


def resolve(name: str, default: Any, valid: Callable[[Any], bool] = lambda v: True,
            coerce: Callable[[Any], Any] = lambda v: v) -> Any:
    """A setting's current value, or ``default`` when unset or not valid here."""
    v = settings().get(name, default)
    try:
        v = coerce(v)
    except (TypeError, ValueError):
        return default
    return v if valid(v) else default


def remember(name: str, value: Any) -> None:
    """Keep a setting for this session and in the URL."""
    settings()[name] = value
    text = format_setting(name, value)
    if st.query_params.get(name) != text:
        st.query_params[name] = text


def rebind(name: str, value: Any) -> None:
    """Set a bound widget's setting from outside it (a button, a click on a chart): kept, and
    the next run seeds the widget from it (:func:`bound` seeds every run)."""
    remember(name, value)


def _keep(name: str, key: str) -> Callable[[], None]:
    """The widget's change callback: its new value becomes the setting before the run starts,
    so that the seeding in :func:`bound` gives the widget the value the user chose."""
    def store() -> None:
        if key in st.session_state:
            settings()[name] = st.session_state[key]
    return store


def bound(name: str, widget: Callable[..., Any], *, default: Any,
          valid: Callable[[Any], bool] = lambda v: True,
          coerce: Callable[[Any], Any] = lambda v: v, **kwargs: Any) -> Any:
    """Draw ``widget`` with its value kept in the session's settings and the URL.

    The settings (read from the URL by a session's first run) are the one state; the widget's
    own state is seeded from them on every run, and a change of the widget is written to them
    by its callback before the run. A widget's state cannot be trusted across pages: Streamlit
    (1.67, ``elements/lib/utils.py``) puts the page's script hash into every element's id, so
    the same key on another page is another widget, which would start at its default (the
    budget at 0 GiB, the first operating point) and overwrite the setting.
    """
    key = f"_w_{name}"
    st.session_state[key] = resolve(name, default, valid, coerce)
    value = widget(key=key, on_change=_keep(name, key), **kwargs)
    remember(name, value)
    return value


def bound_numbers(name: str, fields: Sequence[str], *, default: Sequence[float],
                  valid: Callable[[Any], bool] = lambda v: True,
                  helps: dict[str, str] | None = None, **kwargs: Any) -> tuple[float, ...]:
    """A row of ``st.number_input``, one per field, whose values are kept together as the
    tuple setting ``name`` (in the session and the URL), so a shared link carries them all.

    Each input is seeded from the setting on every run and writes its field back when
    changed, as :func:`bound` does for one widget."""
    cur = resolve(name, tuple(default), lambda v: len(v) == len(fields) and valid(v), tuple)
    keys = [f"_w_{name}_{field}" for field in fields]

    def store() -> None:
        settings()[name] = tuple(float(st.session_state.get(k, c)) for k, c in zip(keys, cur))

    values = []
    for field, key, col, seed in zip(fields, keys, st.columns(len(fields)), cur):
        st.session_state[key] = float(seed)
        with col:
            values.append(float(st.number_input(field.replace("_", " "), key=key,
                                                on_change=store, help=(helps or {}).get(field),
                                                **kwargs)))
    remember(name, tuple(values))
    return tuple(values)
