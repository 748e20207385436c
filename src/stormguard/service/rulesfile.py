"""Writing control-plane edits back into the user's rules file, keeping what they wrote,
atomically (:func:`write_atomic`).

The file is edited as a YAML round trip (ruamel.yaml): comments, key order, quoting,
indentation and flow style stay as they were; an unchanged rule is left exactly as
written (``window: 1m`` stays ``1m``); a changed rule keeps its comments and key order
and only its changed fields are rewritten; a new rule is appended, a deleted one
removed; ``version:`` is updated (added at the top if missing). A file that is a bare
list of rules becomes ``{version: N, rules: [...]}``.

The round trip is pure Python, about 1.5 ms per rule: a rule set of more than
:data:`MAX_ROUND_TRIP` (1,000) rules, most likely generated rather than written by hand,
is rewritten whole by :meth:`RuleSet.dumps` (10x faster, comments lost; logged), as is
every file when ruamel.yaml is not installed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
import tempfile
import time
from typing import Any

from stormguard.ratelimit.rule import DEFAULT_ALGORITHM
from stormguard.ratelimit.rules import FIELDS, RulesError, RuleSet, RuleSpec
from stormguard.ratelimit.rules.model import _parse_window

__all__ = ["MAX_ROUND_TRIP", "remove_stale_temp_files", "render", "write_atomic"]

MAX_ROUND_TRIP = 1000
"""Rules up to which a write keeps the file's layout (see the module docstring)."""

log = logging.getLogger("stormguard.service")


def render(old_text: str | None, rules: RuleSet) -> str:
    """The new text of a rules file that held ``old_text``, now holding ``rules``."""
    if len(rules) > MAX_ROUND_TRIP:
        log.warning("stormguard: %d rules: the rules file is rewritten whole, comments and "
                    "layout are kept only up to %d rules", len(rules), MAX_ROUND_TRIP)
        return rules.dumps()
    try:
        text = _round_trip(old_text, rules)
    except ImportError:
        return rules.dumps()
    except Exception as exc:  # whatever the old text holds, the new rules get written
        log.warning("stormguard: could not keep the rules file's layout (%s); "
                    "rewriting it whole", exc)
        return rules.dumps()
    try:  # the edited text must say exactly what was asked
        back = RuleSet.loads(text)
    except RulesError:
        back = None
    if back is None or back != rules or back.version != rules.version:
        log.warning("stormguard: keeping the rules file's layout failed; rewriting it whole")
        return rules.dumps()
    return text


def _round_trip(old_text: str | None, rules: RuleSet) -> str:
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.util import load_yaml_guess_indent

    yaml = YAML()  # round trip
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap a long line
    doc: Any = None
    if old_text and old_text.strip():
        doc, indent, seq_offset = load_yaml_guess_indent(old_text, yaml=yaml)
        indent = indent or 2
        seq_offset = seq_offset or 0
        yaml.indent(mapping=max(indent - seq_offset, 2) if seq_offset else indent,
                    sequence=indent, offset=seq_offset)
    if isinstance(doc, CommentedSeq):
        top = CommentedMap()
        top["rules"] = doc
        doc = top
    if not isinstance(doc, CommentedMap):
        doc = CommentedMap()
    seq = doc.get("rules")
    if not isinstance(seq, CommentedSeq):
        seq = CommentedSeq()
        doc["rules"] = seq
    if "version" in doc:
        doc["version"] = rules.version
    else:
        doc.insert(0, "version", rules.version)
    by_name = {item["name"]: item for item in seq
               if isinstance(item, CommentedMap) and isinstance(item.get("name"), str)}
    target = []
    for spec in rules.rules:
        item = by_name.get(spec.name)
        if item is None:
            item = CommentedMap()
        _update(item, spec)
        target.append(item)
    keep = {id(item) for item in target}
    for i in reversed(range(len(seq))):
        if id(seq[i]) not in keep:
            del seq[i]
    for i, item in enumerate(target):
        if i < len(seq) and seq[i] is item:
            continue
        for j in range(i, len(seq)):
            if seq[j] is item:
                seq.pop(j)
                break
        seq.insert(i, item)
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def _same(field: str, written: object, value: object) -> bool:
    if field == "window":
        try:
            return _parse_window(written) == value
        except Exception:
            return False
    return type(written) is type(value) and written == value  # True is not 1


def _update(item: Any, spec: RuleSpec) -> None:
    """Make the written rule ``item`` say ``spec``, touching only the fields that differ."""
    try:
        if item and RuleSpec.from_dict(dict(item)) == spec:
            return  # unchanged: left exactly as written
    except RulesError:
        pass
    full = spec.to_dict(full=True)
    for field in list(item):
        if field not in FIELDS:
            del item[field]
        elif not _same(field, item[field], full[field]):
            if full[field] is None or (field == "shadow" and full[field] is False):
                del item[field]
            else:
                item[field] = full[field]
    for field in FIELDS:
        value = full[field]
        if field in item or value is None or value is False:
            continue
        if field == "algorithm" and value == DEFAULT_ALGORITHM:
            continue
        item[field] = value


_TMP_PREFIX, _TMP_SUFFIX = ".rules-", ".tmp"
_EMPTY_TMP_AGE = 60.0
"""Seconds after which an empty, unlocked temporary file counts as abandoned (a writer
creates its file empty and locks it at once; one that is this old never will)."""


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file in the same directory, fsync,
    then ``os.replace`` (readers see the old file or the new one, never a mix).

    The new file keeps the old one's permission bits and, where the process may set
    them, its owner and group (a new file gets ``0o666 & ~umask``, as ``open`` would).
    The temporary file is locked (``flock``) from before its first byte until it is
    renamed, so :func:`remove_stale_temp_files` can tell a crashed writer's file from a
    live one's."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            _lock(f.fileno(), blocking=True)
            if st is None:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            else:
                os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
                if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                    with contextlib.suppress(PermissionError):  # only root may give away
                        os.fchown(f.fileno(), st.st_uid, st.st_gid)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)  # still locked: never a live writer's file to remove
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_stale_temp_files(directory: str) -> list[str]:
    """Remove the temporary files that writers killed mid-write left in ``directory``
    (``.rules-*.tmp`` that no live process holds locked); return their paths."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX)):
            continue
        tmp = os.path.join(directory, name)
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not _lock(fd, blocking=False):
                continue  # a live writer holds it
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_size == 0 and time.time() - st.st_mtime < _EMPTY_TMP_AGE:
                continue  # just created: its writer may not have locked it yet
            os.unlink(tmp)
            removed.append(tmp)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _lock(fd: int, *, blocking: bool) -> bool:
    """An exclusive ``flock`` on ``fd`` (released when the process ends, however it
    ends); False if another process holds it. Without ``fcntl`` (Windows) always True."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _umask() -> int:
    """The process umask, read without changing it (Linux), else the usual 022."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    return 0o022
