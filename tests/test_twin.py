"""The sync twin's discipline: the compat pairs agree, and the generator keeps its rules.

Server-free: ``etcdfence/_acompat.py`` holds each primitive's async and sync forms side
by side; these tests check the two forms against each other, that the two
``_compat`` tables bind matching forms under the same names, and that
``tools/async_to_sync.py`` refuses unused rules, unmapped async names and async prose.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from etcdfence import _acompat
from etcdfence._async import _compat as async_compat
from etcdfence._sync import _compat as sync_compat

ROOT = Path(__file__).resolve().parent.parent
SHARED = {"monotonic"}  # one form serves both sides
#: The surface the async modules use of each standard-library primitive.
STDLIB_SURFACE = {
    "Event": ["set", "clear", "is_set", "wait"],
    "Lock": ["acquire", "release", "locked"],
    "Queue": ["get", "get_nowait", "put", "put_nowait", "empty", "qsize"],
    "Channel": ["unary_unary", "stream_stream", "close"],
}


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", ROOT / "tools/async_to_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _defined_names(path: Path) -> set[str]:
    """Public names a module defines itself (not what it imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_") and n != "T"}


def _table(path: Path) -> dict[str, str]:
    """``name = _c.form`` lines of a ``_compat`` table: name -> form."""
    table = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            (target,) = node.targets
            value = node.value
            assert isinstance(target, ast.Name), ast.dump(node)
            assert isinstance(value, ast.Attribute), f"{target.id} is not bound to a _c form"
            assert isinstance(value.value, ast.Name) and value.value.id == "_c"
            table[target.id] = value.attr
    return table


def _shape(func: Any) -> list[tuple[str, Any, Any]]:
    """A signature without annotations: (name, kind, default) of each parameter."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


def _public_methods(cls: type) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(cls).items()
        if callable(value) and (not name.startswith("_") or name == "__init__")
    }


# --- the compat pairs ---------------------------------------------------------------


def test_every_primitive_is_a_pair_named_by_the_prefix_rule() -> None:
    defined = _defined_names(ROOT / "etcdfence/_acompat.py")
    paired = set(gen.COMPAT_NAMES) | set(gen.COMPAT_NAMES.values())
    assert defined - SHARED == paired, "every _acompat primitive needs both forms in COMPAT_NAMES"
    for async_name, sync_name in gen.COMPAT_NAMES.items():
        prefix = "A" if sync_name[0].isupper() else "a"
        assert async_name == prefix + sync_name, (async_name, sync_name)


@pytest.mark.parametrize("async_name", sorted(gen.COMPAT_NAMES))
def test_the_two_forms_take_the_same_arguments(async_name: str) -> None:
    sync_name = gen.COMPAT_NAMES[async_name]
    aform, sform = getattr(_acompat, async_name), getattr(_acompat, sync_name)
    assert aform is not sform
    if sync_name in STDLIB_SURFACE:
        if sync_name != "Channel":  # threading.Lock is a factory: look at instances
            aform, sform = aform(), sform()
        for method in STDLIB_SURFACE[sync_name]:
            assert callable(getattr(aform, method)), (async_name, method)
            assert callable(getattr(sform, method)), (sync_name, method)
    elif isinstance(sform, bool):
        assert (aform, sform) == (True, False)
    elif isinstance(sform, type) and issubclass(sform, BaseException):
        assert isinstance(aform, type) and issubclass(aform, BaseException)
    elif isinstance(sform, type):
        assert isinstance(aform, type)
        ameths, smeths = _public_methods(aform), _public_methods(sform)
        assert ameths.keys() == smeths.keys(), (async_name, sync_name)
        for name, smethod in smeths.items():
            assert not inspect.iscoroutinefunction(smethod), f"{sync_name}.{name}"
            assert _shape(ameths[name]) == _shape(smethod), f"{sync_name}.{name}"
    else:
        assert inspect.isfunction(aform) and inspect.isfunction(sform), async_name
        assert not inspect.iscoroutinefunction(sform), sync_name
        assert _shape(aform) == _shape(sform), (async_name, sync_name)
        assert inspect.getdoc(aform) and inspect.getdoc(sform), "both forms say what they do"


def test_the_two_tables_bind_matching_forms_under_the_same_names() -> None:
    atable = _table(ROOT / "etcdfence/_async/_compat.py")
    stable = _table(ROOT / "etcdfence/_sync/_compat.py")
    assert atable.keys() == stable.keys()
    assert set(atable.values()) == set(gen.COMPAT_NAMES) | SHARED, "every pair is bound once"
    for name, aform in atable.items():
        sform = gen.COMPAT_NAMES.get(aform, aform)
        assert stable[name] == sform, name
        assert getattr(async_compat, name) is getattr(_acompat, aform)
        assert getattr(sync_compat, name) is getattr(_acompat, sform)
    assert async_compat.IS_ASYNC is True and sync_compat.IS_ASYNC is False


def test_async_forms_are_awaitable_where_the_sync_forms_block() -> None:
    # Spot checks that the async table really holds the async forms.
    assert inspect.iscoroutinefunction(async_compat.sleep)
    assert inspect.iscoroutinefunction(async_compat.wait_event)
    assert inspect.iscoroutinefunction(async_compat.Stream.read)
    assert not inspect.iscoroutinefunction(sync_compat.sleep)
    assert not inspect.iscoroutinefunction(sync_compat.Stream.read)


def test_the_sync_forms_behave() -> None:
    event = sync_compat.Event()
    assert sync_compat.wait_event(event, 0) is False
    event.set()
    assert sync_compat.wait_event(event, None) is True
    queue: Any = sync_compat.Queue()
    with pytest.raises(TimeoutError):
        sync_compat.queue_get(queue, 0)
    sync_compat.queue_put(queue, 7)
    assert sync_compat.queue_get(queue, 1.0) == 7
    assert sync_compat.spawn(3) == 3 and sync_compat.settle(3) == 3 and sync_compat.outcome(3) == 3
    assert sync_compat.uncancellable(4) == 4 and sync_compat.still_wanted() is True
    assert sync_compat.owner_loop() is None


async def _async_forms_behave() -> None:
    event = async_compat.Event()
    assert await async_compat.wait_event(event, 0) is False
    event.set()
    assert await async_compat.wait_event(event, None) is True
    queue: Any = async_compat.Queue()
    with pytest.raises(TimeoutError):
        await async_compat.queue_get(queue, 0)
    async_compat.queue_put(queue, 7)
    assert await async_compat.queue_get(queue, 1.0) == 7

    async def three() -> int:
        return 3

    assert await async_compat.settle(async_compat.spawn(three())) == 3
    assert await async_compat.uncancellable(three()) == 3
    assert async_compat.still_wanted() is True
    assert async_compat.owner_loop() is not None


def test_the_async_forms_behave() -> None:
    import asyncio

    asyncio.run(_async_forms_behave())


# --- the generator's rules ----------------------------------------------------------


def _unasync(source: str) -> str:
    result: str = gen.unasync(source, "example.py", gen.Usage())
    return result


def test_generated_files_carry_the_do_not_edit_header() -> None:
    for path in sorted((ROOT / "etcdfence/_sync").glob("*.py")):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# generated by tools/async_to_sync.py"), path.name
        assert first.endswith("do not edit"), path.name


def test_every_rule_is_used_by_the_current_sources() -> None:
    gen.unasync_all()  # raises RuleError naming any unused rule


def test_an_unused_rule_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(gen.NAMES, "AsyncNothing", "Nothing")
    with pytest.raises(gen.RuleError, match="AsyncNothing"):
        gen.unasync_all()
    monkeypatch.delitem(gen.NAMES, "AsyncNothing")
    monkeypatch.setattr(gen, "PHRASES", [*gen.PHRASES, ("no such prose", "none")])
    with pytest.raises(gen.RuleError, match="no such prose"):
        gen.unasync_all()


def test_an_unmapped_async_name_stops_the_generator() -> None:
    with pytest.raises(gen.RuleError, match="AsyncNewThing"):
        _unasync("x = AsyncNewThing()\n")
    with pytest.raises(gen.RuleError, match="asyncio"):
        _unasync("import asyncio\n")
    with pytest.raises(gen.RuleError, match="__aclose__"):
        _unasync("def __aclose__(self): ...\n")


def test_async_prose_without_a_phrase_stops_the_generator() -> None:
    with pytest.raises(gen.RuleError, match="await"):
        _unasync('def f():\n    """Call it and await the result."""\n')
    with pytest.raises(gen.RuleError, match="task"):
        _unasync("x = 1  # runs as a task\n")


def test_code_prose_and_literals_are_rewritten_by_their_own_rules() -> None:
    source = (
        '"""The asyncio client: use ``async with AsyncClient(...)``."""\n'
        "async def f(c: AsyncClient) -> None:\n"
        "    async with c:  # see AsyncClient.aclose\n"
        "        await c.aclose()\n"
        '    print(f"AsyncClient({c!r})", "async with")\n'
    )
    assert _unasync(source).splitlines()[1:] == [
        '"""The synchronous client: use ``with Client(...)``."""',
        "def f(c: Client) -> None:",
        "    with c:  # see Client.close",
        "        c.close()",
        '    print(f"Client({c!r})", "async with")',  # a literal is not prose: names only
    ]


def test_async_only_blocks_are_dropped() -> None:
    source = "x = 1\n# async-only: begin\ny = 2\n# async-only: end\nz = 3\n"
    assert _unasync(source).splitlines()[1:] == ["x = 1", "z = 3"]
    with pytest.raises(gen.RuleError, match="never ended"):
        _unasync("# async-only: begin\ny = 2\n")
