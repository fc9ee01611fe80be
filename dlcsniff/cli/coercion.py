"""Turning the command line's words into the commands' parameter values without pydantic.

Typer 0.29 coerces every parameter through a pydantic TypeAdapter it builds on first use: importing pydantic and
building the adapters of a command like `decode` cost as much as the rest of the CLI's start-up (README: decode
speed). dlcsniff's commands take only plain kinds (text, whole and real numbers with bounds, paths and lists of
them, choices, flags: a flag given no value is None, which typer would still coerce; and quantities, whose
`parser` (dlcsniff.decoders.quantities) raises ValueError with its message), which this module coerces as typer's
adapters do, with click's messages ("'x' is not a valid integer.", "-1 is not in the range x>=0.",
"'foo' is not one of 'pandas', 'dask'."). A parameter of any other kind, or with typer's path checks (exists,
resolve_path...), keeps typer's own coercion.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, get_args, get_origin

from typer._click.exceptions import BadParameter
from typer._coercion import RuntimeParam
from typer._param_types import coerce_cli_choice, is_literal_type, literal_values

_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


def _integer(text: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{text!r} is not a valid integer.")
    return int(text)


_BOOLEAN_WORDS = {"1": True, "true": True, "t": True, "yes": True, "y": True, "on": True,
                  "0": False, "false": False, "f": False, "no": False, "n": False, "off": False}


def _boolean(text: str) -> bool:
    try:
        return _BOOLEAN_WORDS[text.strip().lower()]
    except KeyError:
        raise ValueError(f"{text!r} is not a valid boolean.") from None


def _real(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a valid float.") from None


@dataclass(frozen=True)
class _PlainParam(RuntimeParam):
    """A parameter of one plain kind (`convert`: word -> value), or a list of them; numbers within low..high."""

    convert: Callable[[str], Any]
    is_list: bool
    low: float | None
    high: float | None

    def _one(self, value: Any) -> Any:
        converted = self.convert(value) if isinstance(value, str) else value
        low, high = self.low, self.high
        if (low is not None and converted < low) or (high is not None and converted > high):
            shown = (f"{low}<=x<={high}" if low is not None and high is not None
                     else f"x>={low}" if low is not None else f"x<={high}")
            raise ValueError(f"{converted} is not in the range {shown}.")
        return converted

    def _coerce_value(self, value: Any, param, ctx) -> Any:
        try:
            if self.is_list:
                return [self._one(item) for item in (value if isinstance(value, (list, tuple)) else [value])]
            return self._one(value)
        except ValueError as exc:
            raise BadParameter(str(exc), ctx=ctx, param=param) from None


def _converter(annotation: Any, info) -> Any:
    """word -> value for a plain annotation, None for any other."""
    if annotation is str:
        return str
    if annotation is bool:
        return _boolean
    if annotation is int:
        return _integer
    if annotation is float:
        return _real
    if annotation is Path and not (info.exists or info.resolve_path or info.allow_dash or info.path_type
                                   or not info.file_okay or not info.dir_okay or info.writable):
        return Path
    if is_literal_type(annotation):
        choices = literal_values(annotation)
        return lambda word: coerce_cli_choice(word, choices=choices, case_sensitive=info.case_sensitive)
    return None


def use_plain_coercion(param) -> None:
    """Give a typer parameter its plain coercion (see the module doc) when it is of a plain kind."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", False) is not None:
        return
    info, annotation = descriptor.parameter_info, descriptor.annotation
    if descriptor.file_annotation is not None or info.clamp:
        return
    is_list = get_origin(annotation) is list
    convert = info.parser or _converter(get_args(annotation)[0] if is_list else annotation, info)
    if convert is not None:
        param._runtime_param = _PlainParam(info, annotation, convert, is_list, info.min, info.max)
