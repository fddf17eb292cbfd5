#!/usr/bin/env python3
"""Generate ``etcdfence/_sync`` from the hand-written ``etcdfence/_async`` sources.

The transformation works on Python tokens, so layout and comments survive, and it
does only what its tables say:

* code: ``async def`` / ``async with`` / ``async for`` lose ``async``, ``await``
  goes, and identifiers are renamed through ``NAMES`` (the public twins, async
  dunders, ``aclose``) and ``COMPAT_NAMES`` (each ``etcdfence/_acompat.py``
  primitive's async form -> its sync form). Nothing is renamed by pattern: an
  identifier that looks async (``Async…``, ``__a…__``) but is not in a table stops
  the generator, and so does ``asyncio`` (it belongs in ``_acompat.py``);
* prose (docstrings and comments): first the literal rewrites of ``PHRASES``, then
  the same identifier renames, word by word. Prose that still says ``await``,
  ``async with``, ``asyncio``, ``coroutine`` or ``task`` afterwards stops the
  generator: add a phrase;
* other string literals: the identifier renames only (``f"AsyncClient(…)"``);
* lines between ``# async-only: begin`` and ``# async-only: end`` are dropped;
* imports are put back in order (``ruff check --select I --fix``): renaming
  ``AsyncIterator`` to ``Iterator`` can unsort a ``from … import`` list.

Every rule must be used by the current sources: a name or phrase that matches
nothing stops the generator (delete the rule), so the tables never rot. On any
error nothing is written and the exit status is 1. Each generated file starts with
a do-not-edit header. Run ``python tools/async_to_sync.py`` to regenerate (``make
sync``) and ``--check`` to fail (exit 1) when the committed twin is stale.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "etcdfence" / "_async"
DST = ROOT / "etcdfence" / "_sync"
#: Every (async source, sync twin) pair of directories: the core and the fence package.
#: A module of one tree imports the other through ``.._async`` / ``..._async``, which the
#: ``_async`` -> ``_sync`` rename in ``NAMES`` turns into the matching twin.
PAIRS: list[tuple[Path, Path]] = [
    (SRC, DST),
    (ROOT / "etcdfence" / "fence" / "_async", ROOT / "etcdfence" / "fence" / "_sync"),
]

#: Identifiers, renamed in code and in prose (as whole words).
NAMES: dict[str, str] = {
    # the public twins and their internals
    "AsyncClient": "Client",
    "AsyncConnection": "Connection",
    "AsyncContender": "Contender",
    "AsyncElection": "Election",
    "AsyncFenceGuard": "FenceGuard",
    "AsyncKeepAlives": "KeepAlives",
    "AsyncLeaderElector": "LeaderElector",
    "AsyncLock": "Lock",
    "AsyncQueueView": "QueueView",
    "AsyncQueueViews": "QueueViews",
    "AsyncSession": "Session",
    "AsyncWatch": "Watch",
    # the recipes (rwlock.py, semaphore.py, group.py)
    "AsyncRWLock": "RWLock",
    "AsyncReadLock": "ReadLock",
    "AsyncWriteLock": "WriteLock",
    "_AsyncSide": "_Side",
    "AsyncSemaphore": "Semaphore",
    "AsyncGroup": "Group",
    "AsyncGroupWatch": "GroupWatch",
    # the fence's engine (etcdfence/fence/_async/engine.py), and the core twin it imports
    "AsyncFence": "Fence",
    "AsyncStore": "Store",
    "AsyncWriter": "Writer",
    # the token admission every fence runs first (etcdfence/fence/_async/admit.py)
    "AsyncAdmission": "Admission",
    "AsyncVerifier": "Verifier",
    "AsyncRepairable": "Repairable",
    "AsyncRevisionSource": "RevisionSource",
    "_async": "_sync",
    # the Redis fence (etcdfence/fence/_async/redis.py) and its two client flavours,
    # side by side in etcdfence/fence/_redis_common.py
    "AsyncRedisFence": "RedisFence",
    "AsyncRedisClient": "RedisClient",
    "ASEND_MAY_LAND": "SEND_MAY_LAND",
    "adrop": "drop",
    "AsyncWatchHub": "WatchHub",
    # protocols and library names
    "aclose": "close",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "AsyncIterator": "Iterator",
    "StopAsyncIteration": "StopIteration",
    "AsyncRetrying": "Retrying",  # tenacity
    # the types of a leader's work and the elector's callbacks (etcdfence/_callbacks.py)
    "AsyncWork": "Work",
    "AsyncOnElected": "OnElected",
    "AsyncOnLost": "OnLost",
    "AsyncOnLeaderChange": "OnLeaderChange",
}

#: Each primitive of ``etcdfence/_acompat.py``: its async form -> its sync form.
#: ``_async/_compat.py`` binds the async forms; this map makes ``_sync/_compat.py``.
COMPAT_NAMES: dict[str, str] = {
    "AIS_ASYNC": "IS_ASYNC",
    "AEvent": "Event",
    "ALock": "Lock",
    "AQueue": "Queue",
    "ASlots": "Slots",
    "ASignal": "Signal",
    "AChannel": "Channel",
    "AAborted": "Aborted",
    "astill_wanted": "still_wanted",
    "auncancellable": "uncancellable",
    "asleep": "sleep",
    "await_event": "wait_event",
    "aqueue_get": "queue_get",
    "aqueue_put": "queue_put",
    "arun_blocking": "run_blocking",
    "aspawn": "spawn",
    "asettle": "settle",
    "aoutcome": "outcome",
    "aowner_loop": "owner_loop",
    "acall_threadsafe": "call_threadsafe",
    "ABackground": "Background",
    "arun_term": "run_term",
    "arun_callback": "run_callback",
    "anew_channel": "new_channel",
    "aclose_channel": "close_channel",
    "aunary": "unary",
    "AStream": "Stream",
}

#: Literal rewrites of docstrings and comments (async prose, sync prose), applied in
#: order before the identifier renames. Whitespace, line breaks included, must match.
PHRASES: list[tuple[str, str]] = [
    # code samples in docstrings
    (
        "``async with client.watch(k) as w: async for batch in w: ...``",
        "``with client.watch(k) as w: for batch in w: ...``",
    ),
    ("``async with ", "``with "),
    ("``async for change in group.watch(): ...``", "``for change in group.watch(): ...``"),
    ("``async with``", "``with``"),
    # what runs the work: tasks on an event loop vs. threads
    ("The asyncio client:", "The synchronous client:"),
    ("An asyncio connection to an etcd cluster.", "A synchronous connection to an etcd cluster."),
    (
        "``stop`` is set and the work task is cancelled, then",
        "``stop`` is set (``work`` must return soon), then",
    ),
    (
        "Safe from any thread or task:\n        from another thread it wakes the elector's"
        " event loop at once.",
        "Safe from any thread.",
    ),
    ("between the threads or\n    tasks of one writer.", "between the threads of\n    one writer."),
    ("on the session's background task/thread", "on the session's background thread"),
    (
        "``work`` is an ``async def``\n    function and each callback a plain or an ``async def``"
        " function (awaited).",
        "``work`` and the callbacks\n    are plain functions (an awaitable they return is"
        " refused).",
    ),
    # the Redis fence
    ("The Redis fence, asyncio API.", "The Redis fence, blocking API."),
    ("``redis.asyncio.Redis`` client", "``redis.Redis`` client"),
    ("shared\n    by all of its tasks.", "shared\n    by all of its threads."),
    # the compat table
    (
        "Each primitive's async form under its plain name (the async side",
        "Each primitive's sync form under its plain name (the sync side",
    ),
]

ASYNC_ONLY_BEGIN = "# async-only: begin"
ASYNC_ONLY_END = "# async-only: end"

#: Identifiers that must never reach the sync twin unmapped.
_LOOKS_ASYNC = re.compile(r"^(?:\w*Async\w*|__a\w+__|asyncio)$")
#: Async vocabulary that must not survive in sync prose (after the phrases ran).
_ASYNC_PROSE = re.compile(r"\b(?:async (?:with|for|def)|await|asyncio|coroutines?|tasks?)\b")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FSTRING_MIDDLE = getattr(tokenize, "FSTRING_MIDDLE", -1)  # Python 3.12+
_STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


class RuleError(Exception):
    """The sources need a rule the tables lack (or a rule is wrong)."""


@dataclass
class Usage:
    """How often each rule matched, over a whole run."""

    names: Counter[str] = field(default_factory=Counter)
    phrases: Counter[int] = field(default_factory=Counter)

    def unused(self) -> list[str]:
        out = [f"name {k!r}" for k in (*NAMES, *COMPAT_NAMES) if not self.names[k]]
        out += [f"phrase {a!r}" for i, (a, _) in enumerate(PHRASES) if not self.phrases[i]]
        return out


def _rename(name: str, usage: Usage, where: str) -> str:
    for table in (NAMES, COMPAT_NAMES):
        if name in table:
            usage.names[name] += 1
            return table[name]
    if _LOOKS_ASYNC.match(name):
        raise RuleError(
            f"{where}: {name!r} has no sync name: add it to NAMES (or, for asyncio,"
            " move the code into etcdfence/_acompat.py)"
        )
    return name


def _rename_words(text: str, usage: Usage, where: str) -> str:
    return _WORD.sub(lambda mo: _rename(mo.group(0), usage, where), text)


def _rewrite_prose(text: str, usage: Usage, where: str) -> str:
    for i, (old, new) in enumerate(PHRASES):
        count = text.count(old)
        if count:
            usage.phrases[i] += count
            text = text.replace(old, new)
    text = _rename_words(text, usage, where)
    leftover = _ASYNC_PROSE.search(text)
    if leftover:
        line = next(ln for ln in text.splitlines() if leftover.group(0) in ln).strip()
        raise RuleError(
            f"{where}: sync prose would say {leftover.group(0)!r} ({line!r}):"
            " add a rewrite to PHRASES"
        )
    return text


def _drop_async_only(source: str, origin: str) -> str:
    out: list[str] = []
    inside = False
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        marker = line.strip()
        if marker == ASYNC_ONLY_BEGIN:
            if inside:
                raise RuleError(f"{origin}:{number}: nested {ASYNC_ONLY_BEGIN!r}")
            inside = True
        elif marker == ASYNC_ONLY_END:
            if not inside:
                raise RuleError(f"{origin}:{number}: {ASYNC_ONLY_END!r} without a begin")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise RuleError(f"{origin}: {ASYNC_ONLY_BEGIN!r} is never ended")
    return "".join(out)


def unasync(source: str, origin: str, usage: Usage) -> str:
    """The sync twin of one async module (``origin`` names it in messages and the header)."""
    source = _drop_async_only(source, origin)
    lines = source.splitlines(keepends=True)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    edits: list[tuple[int, int, int, int, str]] = []  # (srow, scol, erow, ecol, text)
    previous = tokenize.ENCODING  # type of the last token that was not NL or COMMENT
    for i, tok in enumerate(tokens):
        (srow, scol), (erow, ecol) = tok.start, tok.end
        where = f"{origin}:{srow}"
        new = tok.string
        if tok.type == tokenize.NAME and tok.string in ("async", "await"):
            new = ""
            if ecol < len(lines[erow - 1]) and lines[erow - 1][ecol] == " ":
                ecol += 1  # swallow the space after the keyword
        elif tok.type == tokenize.NAME:
            new = _rename(tok.string, usage, where)
        elif tok.type == tokenize.COMMENT:
            new = _rewrite_prose(tok.string, usage, where)
        elif tok.type == tokenize.STRING:
            following = tokens[i + 1].type if i + 1 < len(tokens) else tokenize.ENDMARKER
            if previous in _STATEMENT_START and following == tokenize.NEWLINE:  # docstring
                new = _rewrite_prose(tok.string, usage, where)
            else:
                new = _rename_words(tok.string, usage, where)
        elif tok.type == _FSTRING_MIDDLE:
            new = _rename_words(tok.string, usage, where)
            if new != tok.string and srow == erow and lines[srow - 1][scol:ecol] != tok.string:
                raise RuleError(f"{where}: cannot rename inside this f-string; simplify it")
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok.type
        if new != tok.string:
            edits.append((srow, scol, erow, ecol, new))
    # Patch the changed spans in place, from the end so earlier columns stay valid.
    for srow, scol, erow, ecol, text in reversed(edits):
        first = lines[srow - 1][:scol] + text + lines[erow - 1][ecol:]
        lines[srow - 1 : erow] = [first]
    header = f"# generated by tools/async_to_sync.py from {origin} — do not edit\n"
    result = header + "".join(lines)
    try:
        ast.parse(result, filename=origin.replace("/_async/", "/_sync/"))
    except SyntaxError as exc:
        raise RuleError(f"{origin}: the generated twin does not parse: {exc}") from None
    return result


def sort_imports(text: str, path: Path) -> str:
    """``text`` with its imports in ruff's order (renaming reorders ``from x import a, b``)."""
    command = [sys.executable, "-m", "ruff", "check", "--select", "I", "--fix-only", "--quiet"]
    command += ["--stdin-filename", str(path), "-"]
    try:
        done = subprocess.run(command, input=text, capture_output=True, text=True, cwd=ROOT)
    except OSError as exc:
        raise RuleError(f"cannot run ruff to sort imports: {exc}") from None
    if done.returncode != 0:
        raise RuleError(f"ruff could not sort the imports of {path.name}: {done.stderr.strip()}")
    return done.stdout


def unasync_all() -> dict[Path, str]:
    """Every sync module, by path, imports unsorted; :class:`RuleError` if a rule is
    missing or unused."""
    usage = Usage()
    result = {}
    for src, dst in PAIRS:
        for path in sorted(src.glob("*.py")):
            origin = str(path.relative_to(ROOT))
            result[dst / path.name] = unasync(path.read_text(encoding="utf-8"), origin, usage)
    unused = usage.unused()
    if unused:
        raise RuleError(
            "rules that match nothing (delete them from tools/async_to_sync.py):\n  "
            + "\n  ".join(unused)
        )
    return result


def generate() -> dict[Path, str]:
    """Every sync module, by path, as it should be committed."""
    return {path: sort_imports(text, path) for path, text in unasync_all().items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if _sync/ is stale")
    args = parser.parse_args()
    try:
        wanted = generate()
    except RuleError as exc:
        print(f"async_to_sync: {exc}", file=sys.stderr)
        print("nothing was written", file=sys.stderr)
        return 1
    stale = []
    for path, text in wanted.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(exist_ok=True)
                path.write_text(text, encoding="utf-8")
    extra = [p for _, dst in PAIRS for p in dst.glob("*.py") if p not in wanted]
    if args.check:
        if stale or extra:
            for p in stale + extra:
                print(f"stale: {p.relative_to(ROOT)}", file=sys.stderr)
            print("the sync twin is stale: run `make sync`", file=sys.stderr)
            return 1
        print(f"sync twin is current ({len(wanted)} modules)")
        return 0
    for p in extra:
        p.unlink()
    print(f"generated {len(wanted)} modules ({len(stale)} changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
