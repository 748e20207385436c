"""Structured logs: :class:`JsonFormatter` writes one JSON object per record."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["JsonFormatter"]

# attributes every LogRecord has: anything else was passed as ``extra=`` and is a field
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName", "color_message"}  # uvicorn's ANSI-coloured copy
_ACCESS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", ...extra fields, "exc"}`` on one line
    (``extra=`` fields of the call become fields of the object; uvicorn's access lines
    also get ``client``, ``method``, ``path``, ``http_version``, ``status``)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            out.update(zip(_ACCESS, args, strict=True))  # one field per part of the line
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_"):
                out[k] = v if isinstance(v, str | int | float | bool | None) else repr(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)
