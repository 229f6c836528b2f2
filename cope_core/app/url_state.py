"""Settings kept in the URL query string (``st.query_params``), so that a view can be shared:
read once per session, written back as widgets change, bound to widgets with a default and a
validity check (the codecs are :mod:`.settings`, free of Streamlit)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from .settings import format_setting, parse_query

_SETTINGS = "cope_settings"


def settings() -> dict[str, Any]:
    """This session's settings; the first run of a session reads them from the URL."""
    if _SETTINGS not in st.session_state:
        st.session_state[_SETTINGS] = parse_query(st.query_params.to_dict())
    return st.session_state[_SETTINGS]


def sync_url() -> None:
    """Write every setting to the query string (page switches may have cleared it)."""
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
    """Set a bound widget's setting from outside it (a button): kept, and the widget's own
    state dropped so that the next run seeds it from the setting."""
    remember(name, value)
    st.session_state.pop(f"_w_{name}", None)


def bound(name: str, widget: Callable[..., Any], *, default: Any,
          valid: Callable[[Any], bool] = lambda v: True,
          coerce: Callable[[Any], Any] = lambda v: v, **kwargs: Any) -> Any:
    """Draw ``widget`` with its value kept in the session's settings and the URL.

    The widget's state is seeded from the settings (which the first run read from the URL)
    whenever it is missing or no longer valid, e.g. after switching pages or examples.
    """
    key = f"_w_{name}"
    cur = st.session_state.get(key, None)
    if key not in st.session_state or not valid(cur):
        st.session_state[key] = resolve(name, default, valid, coerce)
    value = widget(key=key, **kwargs)
    remember(name, value)
    return value


def bound_numbers(name: str, fields: Sequence[str], *, default: Sequence[float],
                  valid: Callable[[Any], bool] = lambda v: True, **kwargs: Any
                  ) -> tuple[float, ...]:
    """A row of ``st.number_input``, one per field, whose values are kept together as the
    tuple setting ``name`` (in the session and the URL), so a shared link carries them all.

    Each input is seeded from the setting whenever its state is missing (first run, a page
    switch, the row hidden and shown again), as :func:`bound` does for one widget."""
    cur = resolve(name, tuple(default), lambda v: len(v) == len(fields) and valid(v), tuple)
    values = []
    for field, col, seed in zip(fields, st.columns(len(fields)), cur):
        key = f"_w_{name}_{field}"
        if key not in st.session_state:
            st.session_state[key] = float(seed)
        with col:
            values.append(float(st.number_input(field.replace("_", " "), key=key, **kwargs)))
    remember(name, tuple(values))
    return tuple(values)
