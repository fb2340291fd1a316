"""The Markdown reference table of a pydantic config model (README's configuration reference).

Generated from the models' ``Field(description=...)``, bounds and defaults, so the README never
drifts; ``ftwatch.config.model.config_reference`` applies it to the config model.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel

_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def flat_args(tp: Any) -> list[Any]:
    """Returns the leaf types of a type annotation (``list[A | B]`` -> ``[A, B]``; a plain type -> ``[tp]``)."""
    args = typing.get_args(tp)
    return [x for a in args for x in flat_args(a)] if args else [tp]


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " \\| ".join(str(a) for a in args)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, types.UnionType):
        return " \\| ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return f"map[{_type_name(args[0])}, {_type_name(args[1])}]"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp.__name__
    return {Path: "path"}.get(tp, getattr(tp, "__name__", str(tp)))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(mode="json") for v in value]
    elif isinstance(value, Path):
        value = str(value)
    return f"`{yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix('...').strip()}`"


def model_reference(root: type[BaseModel], footer: str = "") -> str:
    """A Markdown table of every key of ``root``: key, type (with bounds), default and description.

    Nested models (also optional ones, ``Model | None``) become dotted keys; a list of models lists
    their keys as ``key[].sub`` (with the kind in the description when told apart by a
    ``type: Literal[...]`` field, e.g. receivers), a map of models as ``key.<name>.sub``; a field's
    alias (``continue``) is its key.

    Args:
        root: the top-level model.
        footer: a line added after the table (omitted when empty).

    Returns:
        The table, one row per line.
    """
    rows = ["| key | type | default | description |", "|---|---|---|---|"]

    def emit(model: type[BaseModel], prefix: str, note: str = "", seen: tuple = ()) -> None:
        seen = (*seen, model)
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                emit(ann, key + ".", seen=seen)
                continue
            bounds = ", ".join(f"{sym} {getattr(m, attr)}" for m in field.metadata
                               for attr, sym in _BOUNDS.items() if hasattr(m, attr))
            typ = _type_name(ann) + (f" ({bounds})" if bounds else "")
            desc = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{key}` | {typ} | {_default(field)} | {note}{desc} |")
            origin = typing.get_origin(ann)
            if origin in (Union, types.UnionType):   # an optional section
                for sub in typing.get_args(ann):
                    if isinstance(sub, type) and issubclass(sub, BaseModel) and sub not in seen:
                        emit(sub, key + ".", seen=seen)
            if origin in (list, dict):
                for sub in flat_args(ann):
                    if not (isinstance(sub, type) and issubclass(sub, BaseModel)) or sub in seen:
                        continue      # a recursive model (a route's routes) is listed once
                    if "type" in sub.model_fields:
                        kind = typing.get_args(sub.model_fields["type"].annotation)[0]
                        emit(sub, f"{key}[].", f"({kind}) ", seen)
                    else:
                        emit(sub, f"{key}[]." if origin is list else f"{key}.<name>.", seen=seen)

    emit(root, "")
    if footer:
        rows += ["", footer]
    return "\n".join(rows)
