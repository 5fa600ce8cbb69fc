"""Saving and restoring a runtime's namespace, run inside the runtime (for the kernel runtime:
inside its sandboxed child). The host only stores the bytes and hands them back: it never
unpickles them.

`save` leaves the payload in `_cave_session_payload` (bytes) and prints a JSON report;
`restore` takes the payload from the name the host bound it to, and prints a JSON report.
Each value is pickled on its own, so one that cannot be saved or loaded costs only itself.
Functions and classes the cells defined are kept as their source (the runtimes keep each
cell's source in `linecache` as `<cell N>`) and defined again first; modules bound to names
are imported again; the rest is pickled. While pickling and loading, classes and functions
bound in the namespace are found by pickle under their module even when that module is not
importable (`__main__` for the cells', the host's injected modules).
"""

import ast
import inspect
import linecache
import re
import sys
import textwrap
import types

_CELL = re.compile(r"<cell (\d+)>|<restored (.+)>")


def _cell_defined(value, module_name):
    return (inspect.isfunction(value) or inspect.isclass(value)) and getattr(
        value, "__module__", None
    ) == module_name


def _host_made(value):
    """The runtime marked it as bound by the host beside a resource (`__cave_host__`)."""
    if not (inspect.isclass(value) or inspect.isfunction(value)):
        return False
    return value.__dict__.get("__cave_host__") is True


def _cell_classes():
    """The classes the cells (and restored sources) defined at their top level, by name: each
    definition's first line and source, oldest first. Parsed once per save: inspect finds a
    class's file through its module, which for a cell is not a file."""
    cells = []
    for filename in list(linecache.cache):
        match = _CELL.fullmatch(filename) if isinstance(filename, str) else None
        if match:
            order = int(match.group(1)) if match.group(1) else -1
            cells.append((order, filename))
    classes = {}
    for _, filename in sorted(cells):
        lines = linecache.getlines(filename)
        text = "".join(lines)
        if "class " not in text:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                source = "".join(lines[start : node.end_lineno])
                classes.setdefault(node.name, []).append((node.lineno, source))
    return classes


def _class_source(cls, classes):
    """The source of a class a cell defined: the newest definition of its name (on Python
    3.13+, the one at its first line)."""
    first = getattr(cls, "__firstlineno__", None)
    found = [
        source
        for lineno, source in classes.get(cls.__name__, [])
        if first is None or lineno == first
    ]
    if not found:
        raise OSError("source code not available")
    return textwrap.dedent(found[-1])


class _Lookup:
    """For the time of a pickling or loading, each class and function bound in the namespace is
    also an attribute of its module, where pickle looks for it: `sys.modules['__main__']` for
    the cells' (whose namespace is not that module's), and a stand-in module for one that is
    not importable (a host's injected file)."""

    def __init__(self, ns):
        self.ns = ns
        self.set = []  # (module, name, old value or a marker)
        self.added = []  # module names put in sys.modules

    _ABSENT = object()

    def __enter__(self):
        for value in list(self.ns.values()):
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            module_name = getattr(value, "__module__", None)
            qualname = getattr(value, "__qualname__", "")
            if not module_name or "." in qualname or "<" in qualname:
                continue
            module = sys.modules.get(module_name)
            if module is None:
                module = types.ModuleType(module_name)
                sys.modules[module_name] = module
                self.added.append(module_name)
            if module.__dict__ is self.ns:
                continue
            old = getattr(module, qualname, self._ABSENT)
            if old is value:
                continue
            self.set.append((module, qualname, old))
            setattr(module, qualname, value)
        return self

    def __exit__(self, *exc):
        for module, name, old in reversed(self.set):
            if old is self._ABSENT:
                try:
                    delattr(module, name)
                except AttributeError:
                    pass
            else:
                setattr(module, name, old)
        for name in self.added:
            sys.modules.pop(name, None)
        return False


def _in_passes(items, attempt, restored, failed):
    """`attempt(name, item)` for each item, again for those that failed, until a pass makes no
    progress; what never succeeded goes to `failed` with its last error."""
    pending = dict(items)
    errors = {}
    while pending:
        progress = False
        for name, item in list(pending.items()):
            try:
                attempt(name, item)
            except Exception as error:  # noqa: BLE001 - any failure is this item's alone
                errors[name] = _reason(error)
                continue
            del pending[name]
            restored.append(name)
            progress = True
        if not progress:
            break
    failed.extend([name, errors.get(name, "")] for name in pending)


def _reason(error):
    text = str(error).strip().splitlines()
    text = text[0] if text else type(error).__name__
    return text[:200]


def save(ns, registered, keep_prefixes, limit, secret_names=()):
    import json
    import pickle

    module_name = ns.get("__name__", "__main__")
    modules, sources, values = {}, {}, {}
    saved, skipped = [], []
    total = 0
    classes = None  # the cells' class definitions, parsed when the first is needed

    def private(name):
        if not name.startswith("_"):
            return False
        for prefix in keep_prefixes:
            if name.startswith(prefix + "_") and name[len(prefix) + 1 :].isdigit():
                return False
        return True

    # A value that holds a secret's text is not written to disk (the secret comes from the
    # host each time).
    secrets = [
        ns[n].encode("utf-8") for n in secret_names if isinstance(ns.get(n), str) and ns[n]
    ]
    # Neither what the host registered nor what it bound beside it (an object's class, a
    # source function's helpers): the host registers those again, and they are not the model's.
    names = [
        n for n in sorted(ns) if n not in registered and not private(n) and not _host_made(ns[n])
    ]
    with _Lookup(ns):
        for name in names:
            value = ns[name]
            if isinstance(value, types.ModuleType):
                modules[name] = value.__name__
                saved.append([name, "module"])
                continue
            defined = _cell_defined(value, module_name)
            try:
                if defined and inspect.isclass(value):
                    if classes is None:
                        classes = _cell_classes()
                    source = _class_source(value, classes)
                    data = source.encode("utf-8")
                elif defined:
                    source = textwrap.dedent(inspect.getsource(value))
                    data = source.encode("utf-8")
                else:
                    data = pickle.dumps(value, protocol=4)
            except Exception as error:  # noqa: BLE001 - any failure is this value's alone
                skipped.append([name, _reason(error)])
                continue
            if any(secret in data for secret in secrets):
                skipped.append([name, "it holds a secret's text"])
                continue
            if total + len(data) > limit:
                skipped.append(
                    [name, f"{len(data)} bytes would pass the session's size limit of {limit} bytes"]
                )
                continue
            total += len(data)
            if defined:
                # The name its source binds: the one it was defined under (`h = g` keeps g's),
                # or for a lambda the name it was assigned to.
                defined_as = name if value.__name__ == "<lambda>" else value.__name__
                sources[name] = [source, defined_as]
            else:
                values[name] = data
            saved.append([name, type(value).__name__])
    payload = pickle.dumps(
        {
            "format": 1,
            "python": list(sys.version_info[:3]),
            "modules": modules,
            "sources": sources,
            "values": values,
        },
        protocol=4,
    )
    ns["_cave_session_payload"] = payload
    print(json.dumps({"saved": saved, "skipped": skipped, "bytes": len(payload)}), end="")


def restore(ns, name):
    import importlib
    import json
    import pickle

    payload = ns.pop(name)
    restored, failed = [], []
    try:
        data = pickle.loads(payload)
    except Exception as error:  # noqa: BLE001
        print(json.dumps({"restored": [], "failed": [["*", "unreadable: " + _reason(error)]]}), end="")
        return
    for name, module in sorted(data.get("modules", {}).items()):
        try:
            ns[name] = importlib.import_module(module)
            restored.append(name)
        except Exception as error:  # noqa: BLE001
            failed.append([name, _reason(error)])
    # Definitions may need each other (a class deriving from another), and values the
    # definitions (an instance of a class a cell defined).

    def define(name, item):
        source, defined_as = item
        filename = f"<restored {name}>"
        # Kept where a later save finds it again.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        scope = dict(ns)
        exec(compile(source, filename, "exec"), ns, scope)
        # Bound under the saved name (an alias keeps its own name; the original is its own
        # entry if it was saved).
        ns[name] = scope[defined_as]

    def load(name, blob):
        ns[name] = pickle.loads(blob)

    _in_passes(data.get("sources", {}), define, restored, failed)
    # The definitions are all made: one lookup serves every value.
    with _Lookup(ns):
        _in_passes(data.get("values", {}), load, restored, failed)
    print(json.dumps({"restored": sorted(restored), "failed": failed}), end="")
