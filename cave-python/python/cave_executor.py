"""The cell executor of cave-agent's runtimes.

Loaded once per interpreter. Every function here is called by the host (Rust); the model's
code never sees this module: cells run in their runtime's own namespace dict.
"""

import ast
import builtins
import contextvars
import importlib
import io
import keyword
import linecache
import os
import sys
import threading
import traceback
import types

class _Lazy:
    """A module imported on first use: these cost milliseconds at every start (a kernel
    process starts often), and most sessions never need them."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        module = importlib.import_module(self._name)
        globals()[self._name] = module
        return getattr(module, attr)


base64 = _Lazy("base64")
copy = _Lazy("copy")
dataclasses = _Lazy("dataclasses")
enum = _Lazy("enum")
inspect = _Lazy("inspect")
json = _Lazy("json")

# Where the current execution's output goes: set per execution, so concurrent executions on
# other threads (and host code printing meanwhile) each keep their own output.
_output = contextvars.ContextVar("cave_output", default=None)
_TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_loops = threading.local()
# Threads a cell's event loop lends to blocking calls (`asyncio.to_thread`, host calls' `aio`).
_LOOP_THREADS = 64


class _RoutedBinary:
    """`sys.stdout.buffer`: bytes written during a cell are decoded into its output."""

    def __init__(self, text):
        self._text = text

    def write(self, data):
        sink = _output.get()
        if sink is None:
            real = getattr(self._text._real, "buffer", None)
            return real.write(data) if real is not None else len(data)
        sink(bytes(data).decode(self._text.encoding, "replace"))
        return len(data)

    def flush(self):
        pass


class _RoutedText(io.TextIOBase):
    """Replaces `sys.stdout`/`sys.stderr` once: writes go to the current execution, if any."""

    def __init__(self, real):
        self._real = real
        self.buffer = _RoutedBinary(self)

    @property
    def encoding(self):
        return getattr(self._real, "encoding", None) or "utf-8"

    @property
    def errors(self):
        return "replace"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._real.fileno()

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        sink = _output.get()
        if sink is None:
            return self._real.write(text) if self._real is not None else len(text)
        sink(text)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        sink = _output.get()
        if sink is None:
            if self._real is not None:
                self._real.flush()
        else:
            # A runtime that buffers a cell's output sends it now.
            flush = getattr(sink, "flush", None)
            if flush is not None:
                flush()


# The routers installed as `sys.stdout` and `sys.stderr`, kept so that a cell that replaces
# either cannot silence the cells after it.
_routers = {}


_thread_start = threading.Thread.start


def _start_with_output(thread, *args, **kwargs):
    """`Thread.start` where the output route of a cell is the runtime's own (in-process: one
    `write` per runtime, which gives the running cell what it gets and keeps what comes
    between cells for the next): a thread a cell starts writes through it, also in later cells;
    threads started elsewhere (the host's own) keep the real streams. The kernel's worker has no
    need of it: what a thread writes there reaches descriptor 1, which goes to the running cell."""
    sink = _output.get()
    if sink is not None:
        run = thread.run

        def run_with_output():
            _output.set(sink)
            run()

        thread.run = run_with_output
    return _thread_start(thread, *args, **kwargs)


# Threads in which a `KeyboardInterrupt` was swallowed: raised inside a weakref callback or a
# `__del__` (importlib's own among them), where Python only reports it. The in-process runtime
# raises its interrupt again there (`take_swallowed_interrupt`).
_swallowed_interrupts = set()


class _UnraisableHook:
    """Notes a swallowed `KeyboardInterrupt` instead of printing it; hands anything else on."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _swallowed_interrupts.add(threading.get_ident())
            return
        self.previous(unraisable)


def take_swallowed_interrupt(ident):
    """Whether a `KeyboardInterrupt` was swallowed in thread `ident` since last asked."""
    try:
        _swallowed_interrupts.remove(ident)
    except KeyError:
        return False
    return True


def install(threads_keep_the_route=False):
    """Routes `sys.stdout` and `sys.stderr` through the executor, and provides the
    `cave_agent.runtime` compatibility module (idempotent). `threads_keep_the_route`: threads
    a cell starts write through the route it was given (see `_start_with_output`)."""
    if threads_keep_the_route:
        threading.Thread.start = _start_with_output
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if not isinstance(current, _RoutedText):
            _routers[name] = _RoutedText(current)
            setattr(sys, name, _routers[name])
        elif name not in _routers:
            _routers[name] = current
    _install_display()
    if not isinstance(sys.unraisablehook, _UnraisableHook):
        sys.unraisablehook = _UnraisableHook(sys.unraisablehook)
    if "cave_agent.runtime" not in sys.modules:
        package = types.ModuleType("cave_agent", "CaveAgent compatibility: injection modules import from here.")
        runtime = types.ModuleType("cave_agent.runtime")
        for cls in (Function, Variable, Type):
            setattr(package, cls.__name__, cls)
            setattr(runtime, cls.__name__, cls)
        package.runtime = runtime
        package.__path__ = []
        sys.modules["cave_agent"] = package
        sys.modules["cave_agent.runtime"] = runtime


def send_stray_output_to_stderr():
    """Output written outside any execution (threads a cell started, late tasks) goes to the
    real stderr instead of stdout, e.g. when stdout carries a machine-readable stream."""
    install()
    if _routers["stderr"]._real is not None:
        _routers["stdout"]._real = _routers["stderr"]._real


class Function:
    """An exported function (CaveAgent's `Function`)."""

    def __init__(self, func, description=None, include_doc=True):
        self.func = func
        self.name = func.__name__
        self.description = description
        self.include_doc = include_doc


class Variable:
    """An exported variable (CaveAgent's `Variable`)."""

    def __init__(self, name, value=None, description=None):
        self.name = name
        self.value = value
        self.description = description


class Type:
    """An exported class (CaveAgent's `Type`)."""

    def __init__(self, value, description=None, include_schema=True, include_doc=True):
        if not isinstance(value, type):
            raise ValueError(f"Type value must be a class, got {type(value).__name__}")
        self.value = value
        self.name = value.__name__
        self.description = description
        self.include_schema = include_schema
        self.include_doc = include_doc


# Rich output: `display()`, objects' `_repr_*_` forms, and matplotlib figures, as IPython has
# them. Each item reaches the host through the current cell's `show` (set per execution, like
# `_output`) as `(bundle, omitted)`: `{mime: str | bytes}` with `text/plain` always, and
# `{mime: size}` for the forms left out because they were over the limit.
# One variable for the three a cell sets (each set and reset costs a cell time): `show`; whose
# figures a cell shows, its runtime's (the `owner` of its `show`, or `show` itself: in one
# interpreter several runtimes run cells at once, and pyplot's figures are global); and the
# largest form of one display item, in bytes, the runtime's (None: `_display_limit`).
_display = contextvars.ContextVar("cave_display", default=(None, None, None))

# The default largest form of one display item (`set_display_limit`).
_display_limit = [16 << 20]

# The `_repr_*_` methods, in the order IPython prefers them.
_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
    ("text/latex", "_repr_latex_"),
)
_BINARY = ("image/png", "image/jpeg", "image/gif", "image/webp")


def set_display_limit(limit):
    """Sets the largest form of a display item the host is sent, in bytes."""
    _display_limit[0] = max(0, int(limit))


def _form(mime, data):
    """A form as the host takes it (bytes for images, text otherwise), or None."""
    if isinstance(data, tuple) and data:  # `(data, metadata)`, as `_repr_*_` may return
        data = data[0]
    if data is None:
        return None
    if mime in _BINARY:
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data)
        if isinstance(data, str):  # base64, as Jupyter bundles carry images
            try:
                return base64.b64decode("".join(data.split()), validate=True)
            except ValueError:
                return None
        return None
    if mime == "application/json" or mime.endswith("+json"):
        if isinstance(data, str):
            return data
        try:
            return json.dumps(data, default=repr)
        except (TypeError, ValueError, RecursionError):
            return None
    if isinstance(data, str):
        return data
    if isinstance(data, (bytes, bytearray)):
        return bytes(data).decode("utf-8", "replace")
    return None


def _is_figure(obj):
    module = getattr(type(obj), "__module__", None) or ""
    return module.startswith("matplotlib.figure") and _method(obj, "savefig") is not None


def _method(obj, name):
    """`obj.name` if it is callable; None when it is not, or when looking it up raises (the
    object is the model's: its `__getattr__` may do anything)."""
    try:
        found = getattr(obj, name, None)
    except Exception:
        return None
    return found if callable(found) else None


def _figure_png(figure):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def mime_bundle(obj):
    """The forms of `obj`: `{mime: str | bytes}`, `text/plain` always. A form whose method
    raises or returns something else is left out (the object is the model's: it may be
    anything)."""
    bundle = {}
    if _is_figure(obj):
        try:
            bundle["image/png"] = _figure_png(obj)
        except Exception:
            pass
    elif not isinstance(obj, type):  # a class has the methods, unbound
        method = _method(obj, "_repr_mimebundle_")
        if method is not None:
            try:
                found = method(include=None, exclude=None)
            except Exception:
                found = None
            if isinstance(found, tuple) and found:
                found = found[0]
            if isinstance(found, dict):
                for mime, data in found.items():
                    if isinstance(mime, str):
                        form = _form(mime, data)
                        if form is not None:
                            bundle[mime] = form
        for mime, name in _REPR_METHODS:
            if mime in bundle:
                continue
            method = _method(obj, name)
            if method is None:
                continue
            try:
                form = _form(mime, method())
            except Exception:
                continue
            if form is not None:
                bundle[mime] = form
    if not isinstance(bundle.get("text/plain"), str):
        try:
            bundle["text/plain"] = repr(obj)
        except Exception:
            bundle["text/plain"] = f"<{type(obj).__name__} object>"
    return bundle


def has_rich_form(obj):
    """Whether `obj` has a form beyond its text (what makes a cell's last value an item)."""
    if _is_figure(obj):
        return True
    if isinstance(obj, type):
        return False
    return any(
        _method(obj, name) is not None
        for name in ("_repr_mimebundle_",) + tuple(name for _, name in _REPR_METHODS)
    )


def _send(bundle):
    """Writes an item's text form into the output (where it was shown) and sends the item to
    the current cell's host, leaving out forms over the limit; without a cell (a thread
    outlived it), the text is printed alone."""
    limit = _display.get()[2]
    if limit is None:
        limit = _display_limit[0]
    omitted = {}
    for mime in list(bundle):
        data = bundle[mime]
        size = len(data.encode("utf-8", "replace")) if isinstance(data, str) else len(data)
        if mime != "text/plain" and size > limit:
            omitted[mime] = size
            del bundle[mime]
    text = bundle.get("text/plain", "")
    if len(text) > limit:
        omitted["text/plain"] = len(text)
        bundle["text/plain"] = text[:limit]
    write = _output.get()
    show = _display.get()[0]
    if write is None or show is None:
        sys.stdout.write(bundle.get("text/plain", "") + "\n")
        return
    write(bundle.get("text/plain", "") + "\n")
    show(bundle, omitted)


def display(*objs, raw=False, **_ignored):
    """Shows each object with its richest forms (IPython's `display`): a DataFrame as a table,
    an image as an image, a matplotlib figure as a PNG. `raw=True`: each object is already a
    bundle, `{mime type: data}`."""
    for obj in objs:
        if raw and isinstance(obj, dict):
            bundle = {}
            for mime, data in obj.items():
                if isinstance(mime, str):
                    form = _form(mime, data)
                    if form is not None:
                        bundle[mime] = form
            if not isinstance(bundle.get("text/plain"), str):
                bundle["text/plain"] = f"<{', '.join(bundle) or 'empty'} display>"
        else:
            bundle = mime_bundle(obj)
        _send(bundle)


def _show_figures():
    """Sends every open matplotlib figure as an item and closes it (what `plt.show()` does
    here, and what happens to figures left open when a cell ends). Nothing when matplotlib was
    never imported."""
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    # Still being imported by another thread (another runtime's cell in this interpreter):
    # then no figure of this cell can be open yet.
    gcf = getattr(helpers, "Gcf", None)
    if gcf is None:
        return
    owner = _display.get()[1]
    managers = [
        m
        for m in gcf.get_all_fig_managers()
        if owner is not None and getattr(m.canvas, "_cave_owner", None) is owner
    ]
    for manager in managers:
        figure = manager.canvas.figure
        try:
            _send(mime_bundle(figure))
        finally:
            gcf.destroy(manager)


def _matplotlib_backend():
    """The matplotlib backend cells draw with (`MPLBACKEND=module://cave_matplotlib`): Agg's
    canvas, imported when a cell first uses matplotlib, and a `show()` that sends the figures
    as display items. (matplotlib copies the module's attributes, so each is a real one once
    looked up.)"""
    module = types.ModuleType("cave_matplotlib")

    def lazy(name):
        if name == "FigureCanvas":
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            class value(FigureCanvasAgg):
                """Agg's canvas, knowing whose cell drew it."""

                def __init__(self, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    self._cave_owner = _display.get()[1]

            value.__name__ = value.__qualname__ = "FigureCanvas"
        elif name == "FigureManager":
            from matplotlib.backend_bases import FigureManagerBase as value
        else:
            raise AttributeError(name)
        setattr(module, name, value)
        return value

    def show(*args, **kwargs):
        _show_figures()

    module.__getattr__ = lazy
    module.show = show
    return module


def _install_display():
    """`display` as a builtin, and the matplotlib backend (unless the environment chose one)."""
    builtins.display = display
    if "cave_matplotlib" not in sys.modules:
        sys.modules["cave_matplotlib"] = _matplotlib_backend()
    os.environ.setdefault("MPLBACKEND", "module://cave_matplotlib")


def _loop():
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        # Imported on the first cell that awaits: asyncio costs tens of milliseconds at start-up.
        import asyncio

        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.new_event_loop()
        # Host calls wait on their thread while the host works: a cell runs them side by side
        # on the loop's executor (`asyncio.to_thread`, `f.aio(...)`), whose default of a few
        # threads per core would make the tenth of ten calls wait for the first.
        loop.set_default_executor(ThreadPoolExecutor(_LOOP_THREADS, thread_name_prefix="cave-loop"))
        _loops.loop = loop
    return loop


def _forget_loop():
    """In a forked copy of this process the loop's threads are gone and its selector is shared
    with the parent's: the next cell that awaits makes a loop of its own."""
    _loops.loop = None


os.register_at_fork(after_in_child=_forget_loop)


def _evaluate(code, namespace):
    """Runs a code object; awaits it when the cell used top-level `await`."""
    result = eval(code, namespace)
    if code.co_flags & 0x80:  # CO_COROUTINE: the cell awaited at top level
        import asyncio

        loop = _loop()
        # Inside a host that runs its own loop on this thread (a Jupyter kernel), that loop is
        # blocked until the cell ends anyway: the cell's loop runs in its place meanwhile.
        outer = asyncio._get_running_loop()
        if outer is not None:
            asyncio._set_running_loop(None)
        try:
            return loop.run_until_complete(result)
        except BaseException:
            if loop.is_running():
                _loops.loop = None
            raise
        finally:
            if outer is not None:
                asyncio._set_running_loop(outer)
    return result


def _restore_routing():
    """Puts the routers back if the cell replaced `sys.stdout`/`sys.stderr` and left them so;
    returns the names it restored."""
    # Most cells leave both in place: said at once.
    if sys.stdout is _routers.get("stdout") and sys.stderr is _routers.get("stderr"):
        return ()
    replaced = [name for name, router in _routers.items() if getattr(sys, name, None) is not router]
    for name in replaced:
        setattr(sys, name, _routers[name])
    return replaced


def release_import_locks():
    """Gives back the import locks this thread still holds between cells; returns how many.

    An exception raised in a thread from outside (an interrupt) can land inside importlib
    between its taking a lock and the `try` that gives it back. Between cells this thread
    imports nothing, so a lock it holds then is such a one: held on, it would stop every other
    thread's imports for good."""
    import _imp

    released = 0
    while True:
        try:
            _imp.release_lock()
        except RuntimeError:  # not held by this thread (any more)
            break
        released += 1
    me = threading.get_ident()
    bootstrap = sys.modules.get("_frozen_importlib")
    for ref in list(getattr(bootstrap, "_module_locks", {}).values()):
        lock = ref()
        while lock is not None and getattr(lock, "owner", None) == me and lock.count:
            lock.release()
            released += 1
    return released


# Files whose frames a traceback never shows: the executor's, and those of the runtime's own
# machinery (`hide_frames_of`), so the model sees its own lines the same on every runtime.
_HIDDEN_FILES = set()


def hide_frames_of(filename):
    """Leaves frames of code compiled as `filename` out of cells' tracebacks."""
    _HIDDEN_FILES.add(filename)


def _format_exception(error):
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _HIDDEN_FILES:
        tb = tb.tb_next
    if tb is not None and any(
        t.tb_frame.f_code.co_filename in _HIDDEN_FILES for t in _walk(tb)
    ):
        shown = [t for t in _walk(tb) if t.tb_frame.f_code.co_filename not in _HIDDEN_FILES]
        tb = None
        for t in reversed(shown):
            tb = types.TracebackType(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return "".join(traceback.format_exception(type(error), error, tb))


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


# The functions, types and objects the host bound, by name, kept in the namespace itself (one
# interpreter may serve several runtimes): variables are not there, the model's code is meant
# to change those. A cell that rebinds or deletes one is told so.
_HOST_KEY = "__cave_host_bindings__"


def host_bound(namespace, name, obj, watched, companions=()):
    """Records that the host bound `obj` as `name` in `namespace` (`watched`: a function, type
    or object, which a cell should not rebind), and marks `companions`, the values bound beside
    it (an object's class, a source function's helpers), as the host's: a session save leaves
    them out."""
    bindings = namespace.get(_HOST_KEY)
    if type(bindings) is not dict:
        bindings = namespace[_HOST_KEY] = {}
    if watched:
        bindings[name] = obj
    else:
        bindings.pop(name, None)
    for companion in companions:
        try:
            companion.__cave_host__ = True
        except (AttributeError, TypeError):
            pass


def _host_kind(obj):
    if isinstance(obj, type):
        return "class"
    kind = type(obj).__name__
    return kind if kind in ("function", "builtin_function_or_method") else f"{kind} object"


def _rebound_note(rebound):
    names = ", ".join(f"`{name}` (the host's {kind})" for name, kind in rebound)
    return (
        f"[note: this code rebound {names}; in this session that name no longer reaches the "
        "host's value. Bind your own values under other names "
        "(for a module: `import time as time_module`).]\n"
    )


def _compile_as_read(source, filename, split):
    """The cell compiled from its source as the host read it (`split`: 0 when its last
    statement is not an expression, else `(start, line)`, where the trailing expression starts,
    in characters, at the start of line `line`): the body's code and the trailing expression's,
    or None when the reading does not compile (the parse then decides, and reports the error as
    it always does)."""
    try:
        if split == 0:
            return compile(source, filename, "exec", _TOP_LEVEL_AWAIT), None
        start, line = split
        body, last = source[:start], source[start:]
        code = compile(body, filename, "exec", _TOP_LEVEL_AWAIT)
        # On its own line, as in the cell: tracebacks name the right line.
        trailing = compile("\n" * (line - 1) + last, filename, "eval", _TOP_LEVEL_AWAIT)
        return code, trailing
    except (SyntaxError, ValueError):
        return None


def _compile_parsed(source, filename):
    """The cell parsed, its trailing expression (IPython's rule: the last statement, when it is
    an expression statement) taken off the body: the body's code and the expression's."""
    tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST | _TOP_LEVEL_AWAIT)
    trailing = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        trailing = compile(ast.Expression(tree.body.pop().value), filename, "eval", _TOP_LEVEL_AWAIT)
    return compile(tree, filename, "exec", _TOP_LEVEL_AWAIT), trailing


def run_cell(source, namespace, filename, write, show=None, display_limit=None, split=None):
    """Runs `source` in `namespace`, writing its output with `write` and sending its display
    items to `show` (`(bundle, omitted)`, see `_send`), each form at most `display_limit`
    bytes (None: the default, `set_display_limit`). `split` is where the host read the cell's
    trailing expression to be (see `_compile_as_read`); None: the cell is parsed for it.

    Returns None on success, or `(type name, message)` of the exception it raised (its
    traceback has been written). The value of a trailing expression is echoed as its repr, and
    shown as an item too when it has a rich form; figures left open are shown at the end.
    """
    token = _output.set(write)
    displaying = _display.set((show, getattr(show, "owner", show), display_limit))
    # Whatever an earlier cell (or a thread) did to them, this cell's output is routed.
    _restore_routing()
    bindings = namespace.get(_HOST_KEY)
    host = (
        [(name, obj) for name, obj in bindings.items() if namespace.get(name) is obj]
        if type(bindings) is dict
        else ()
    )
    try:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        compiled = _compile_as_read(source, filename, split) if split is not None else None
        if compiled is None:
            try:
                compiled = _compile_parsed(source, filename)
            except (SyntaxError, ValueError) as error:
                write("".join(traceback.format_exception_only(type(error), error)))
                return (type(error).__name__, str(error))
        code, trailing = compiled
        try:
            _evaluate(code, namespace)
            if trailing is not None:
                value = _evaluate(trailing, namespace)
                if value is not None:
                    namespace["_"] = value
                    if has_rich_form(value):
                        _send(mime_bundle(value))
                    else:
                        write(repr(value) + "\n")
        except BaseException as error:  # the model's code may raise anything, KeyboardInterrupt included
            write(_format_exception(error))
            return (type(error).__name__, str(error))
        return None
    finally:
        # Figures the cell left open, also when it raised (IPython's inline backend shows them).
        try:
            _show_figures()
        except Exception as error:
            write(f"[note: a figure could not be drawn: {type(error).__name__}: {error}]\n")
        # Against the host's bindings as they are now: the host may bind a name anew while the
        # cell runs (a kernel worker serves it during a host call), which is not the cell's doing.
        now = namespace.get(_HOST_KEY)
        now = now if type(now) is dict else {}
        rebound = [
            (name, _host_kind(obj))
            for name, obj in host
            if name in now and namespace.get(name) is not now[name]
        ]
        if rebound:
            write(_rebound_note(rebound))
        replaced = _restore_routing()
        if replaced:
            streams = " and ".join(f"sys.{name}" for name in replaced)
            write(
                f"[note: this code replaced {streams} and left it replaced; it has been restored so that "
                "later output is seen. Use contextlib.redirect_stdout to capture output temporarily.]\n"
            )
        _output.reset(token)
        _display.reset(displaying)


_HIDDEN_FILES.add(run_cell.__code__.co_filename)

_KIND_NAMES = {}


def _kind_name(kind):
    if not _KIND_NAMES:
        P = inspect.Parameter
        _KIND_NAMES.update(
            {
                P.POSITIONAL_ONLY: "positional_only",
                P.POSITIONAL_OR_KEYWORD: "positional_or_keyword",
                P.VAR_POSITIONAL: "var_positional",
                P.KEYWORD_ONLY: "keyword_only",
                P.VAR_KEYWORD: "var_keyword",
            }
        )
    return _KIND_NAMES[kind]


def _parameter_source(params, defaults):
    """The parameter list of a generated `def`, and the names it binds, in order."""
    parts, names = [], []
    star = False
    for index, (name, kind, has_default, default) in enumerate(params):
        if kind == "keyword_only" and not star:
            parts.append("*")
            star = True
        if kind == "var_positional":
            parts.append("*" + name)
            star = True
        elif kind == "var_keyword":
            parts.append("**" + name)
        elif has_default:
            key = f"__cave_default_{index}"
            defaults[key] = default
            parts.append(f"{name}={key}")
        else:
            parts.append(name)
        names.append(name)
        following = params[index + 1][1] if index + 1 < len(params) else None
        if kind == "positional_only" and following != "positional_only":
            parts.append("/")
    return ", ".join(parts), names


def make_function(name, params, doc, is_async, call, self_name=None):
    """A function with a real signature that calls `call([(param, value), ...])`.

    `params` are `(name, kind, has_default, default)`. With `self_name`, the function is a
    method whose first parameter is `self_name` (not passed to `call`). Its `aio` attribute is
    the awaitable form, with the same parameters (without `self_name`: `obj.method.aio(...)`
    reaches it through the bound method): the call runs on a thread of the cell's loop, so
    that `asyncio.gather` runs several at once. A host function declared `async` is that form.
    """
    defaults = {"__cave_call": call, "__cave_await": _host_await}
    params_src, names = _parameter_source(params, defaults)
    own_params = params_src
    if self_name is not None:
        params_src = self_name + (", " + params_src if params_src else "")
    args = ", ".join(f"({n!r}, {n})" for n in names)
    awaited = f"await __cave_await(__cave_call, [{args}])"
    if is_async:
        source = f"async def {name}({params_src}):\n    return {awaited}\n"
    else:
        source = f"def {name}({params_src}):\n    return __cave_call([{args}])\n"
    source += f"async def aio({own_params}):\n    return {awaited}\n"
    scope = dict(defaults)
    exec(compile(source, f"<cave {name}>", "exec"), scope)
    function = scope[name]
    aio = scope["aio"]
    for each in (function, aio):
        each.__doc__ = doc
        each.__module__ = "__main__"
    aio.__name__ = "aio"
    aio.__qualname__ = f"{name}.aio"
    function.aio = aio
    return function


async def _host_await(call, bound):
    """A host call as an awaitable: on a thread of the running loop's executor, in a copy of
    the cell's context (its output route)."""
    import asyncio

    return await asyncio.to_thread(call, bound)


def make_record(name, doc, fields):
    """A dataclass from `(field, annotation, has_default, default)` entries."""
    spec = []
    for field, annotation, has_default, default in fields:
        if not has_default:
            spec.append((field, annotation))
        elif isinstance(default, (list, dict, set)):
            spec.append((field, annotation, dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d))))
        else:
            spec.append((field, annotation, dataclasses.field(default=default)))
    cls = dataclasses.make_dataclass(name, spec, namespace={"__doc__": doc})
    cls.__module__ = "__main__"
    return cls


def make_enum(name, doc, members):
    """An Enum from `(member, value)` pairs."""
    cls = enum.Enum(name, members, module="__main__")
    if doc:
        cls.__doc__ = doc
    return cls


def make_object(type_name, doc, methods, call):
    """A proxy for a host object: each method calls `call(method, [(param, value), ...])`.

    `methods` are `(name, params, doc, is_property)`; a property calls `call(name, [])` when
    read, and cannot be set. Returns the instance; its class is `type_name`.
    """
    body = {"__doc__": doc, "__slots__": (), "__module__": "__main__"}
    for method, params, method_doc, is_property in methods:
        if is_property:
            body[method] = property(lambda self, m=method: call(m, []), doc=method_doc)
            continue
        body[method] = make_function(method, params, method_doc, False, lambda bound, m=method: call(m, bound), "self")
    body["__repr__"] = lambda self: f"<{type_name} object (host)>"
    return type(type_name, (), body)()


def to_plain(value):
    """What a value converts as when it crosses to the host: records as dicts, enum members
    by name; anything else unchanged."""
    # Neither a record nor an enum member exists before its module was imported.
    loaded = sys.modules
    if "dataclasses" in loaded and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if "enum" in loaded and isinstance(value, enum.Enum):
        return value.name
    return value


_MAX_DEPTH = 512
_EXACT = frozenset({type(None), bool, int, float, str, bytes})


class Unsupported(Exception):
    """A value has no counterpart on the host: its message is the Python type found."""


def plain(value):
    """`value` as exact built-in types that `marshal` writes, converted as the in-process
    runtime converts: subclasses as their base, records as dicts, enum members by name,
    integer-likes as ints. Raises `Unsupported` with the type that does not convert."""
    try:
        return _plain(value, 0)
    except RecursionError:
        raise Unsupported(f"structure nested deeper than {_MAX_DEPTH} levels") from None


def _plain(value, depth):
    # One frame per level (no comprehensions), so that the depth bound, not Python's recursion
    # limit, is what stops a deep structure.
    kind = type(value)
    if kind in _EXACT:
        return value
    if depth >= _MAX_DEPTH:
        raise Unsupported(f"structure nested deeper than {_MAX_DEPTH} levels")
    if kind is dict or isinstance(value, dict):
        if kind is dict and all(map(_EXACT.__contains__, map(type, value))) and all(
            map(_EXACT.__contains__, map(type, value.values()))
        ):
            return value
        out = {}
        for k, v in value.items():
            out[_plain(k, depth + 1)] = _plain(v, depth + 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        # The common case, checked in C: a container of plain scalars is sent as it is.
        if kind in (list, tuple, set, frozenset) and all(map(_EXACT.__contains__, map(type, value))):
            return value
        items = []
        for item in value:
            items.append(_plain(item, depth + 1))
        if isinstance(value, list):
            return items
        if isinstance(value, tuple):
            return tuple(items)
        return set(items)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if hasattr(value, "__index__"):
        try:
            return int(value.__index__())
        except Exception:
            pass
    converted = to_plain(value)
    if converted is not value:
        return _plain(converted, depth + 1)
    raise Unsupported(type(value).__qualname__)


def describe_exports(exports):
    """What `load_exports` returned, as plain data for the host: `(kind, name, description,
    data)`, where data holds the doc, a function's signature, a variable's value (or its type
    when the value does not convert), and a class's fields (defaults as values, or as their
    repr), members or methods."""
    described = []
    for kind, name, obj, description, details in exports:
        data = {"doc": details.get("doc")}
        if kind == "function":
            data["signature"] = details.get("signature")
            data["is_async"] = bool(details.get("is_async"))
        elif kind == "variable":
            data["type"] = type(obj).__qualname__
            try:
                data["value"] = plain(obj)
            except Unsupported:
                pass
        if "fields" in details:
            fields = []
            for field, annotation, has_default, default in details["fields"]:
                entry = [field, annotation, has_default, None, None]
                if has_default:
                    try:
                        entry[3] = plain(default)
                    except Unsupported:
                        entry[4] = repr(default)
                fields.append(tuple(entry))
            data["fields"] = fields
        if "members" in details:
            members = []
            for member, value in details["members"]:
                try:
                    members.append((member, plain(value)))
                except Unsupported:
                    members.append((member, None))
            data["members"] = members
        if "methods" in details:
            data["methods"] = details["methods"]
        described.append((kind, name, description, data))
    return described


def read_spooled(fd):
    """The text of a cell's whole output from the host's open file `fd` (its own description,
    read from the start; the host's stays open)."""
    with os.fdopen(os.dup(fd), encoding="utf-8", newline="") as file:
        file.seek(0)
        return file.read()


def free_name(namespace, prefix, start, taken):
    """The first `{prefix}_{n}` with n >= start bound neither in `namespace` nor in `taken`."""
    index = start
    while f"{prefix}_{index}" in namespace or f"{prefix}_{index}" in taken:
        index += 1
    return index


def reset_namespace(namespace):
    """Empties a namespace dict and gives it fresh builtins."""
    namespace.clear()
    namespace["__builtins__"] = builtins
    namespace["__name__"] = "__main__"


def _annotation(a):
    """An annotation as the prompt shows it (`list[str]`, `Optional[Order]`), without modules."""
    import typing

    if a is inspect.Parameter.empty or a is inspect.Signature.empty:
        return None
    if isinstance(a, str):
        return a
    if a is None or a is type(None):
        return "None"
    if isinstance(a, typing.ForwardRef):
        return a.__forward_arg__
    origin, args = typing.get_origin(a), typing.get_args(a)
    if origin is typing.Union or type(a).__name__ == "UnionType":
        arms = [x for x in args if x is not type(None)]
        if len(arms) == 1 and len(args) == 2:
            return f"Optional[{_annotation(arms[0])}]"
        return "Union[" + ", ".join(_annotation(x) for x in args) + "]"
    if origin is not None:
        name = getattr(origin, "__name__", None) or str(origin).replace("typing.", "")
        if not args:
            return name
        return f"{name}[" + ", ".join(_annotation(x) if x is not Ellipsis else "..." for x in args) + "]"
    return getattr(a, "__name__", None) or str(a).replace("typing.", "")




def _describe_signature(sig):
    """`(params, returns)`: each parameter as `(name, kind, annotation, default repr)`, with
    `None` for what it lacks; the host renders the signature from them."""
    params = []
    for p in sig.parameters.values():
        default = None if p.default is p.empty else repr(p.default)
        params.append((p.name, _kind_name(p.kind), _annotation(p.annotation), default))
    return params, _annotation(sig.return_annotation)


def _doc(obj):
    doc = getattr(obj, "__doc__", None)
    return doc.strip() if isinstance(doc, str) and doc.strip() else None


def _signature(obj, drop_self=False):
    """The described signature, or `None` when Python cannot inspect it."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    if drop_self:
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    return _describe_signature(sig)


def _describe(kind, name, obj, description):
    """One export as `(kind, name, object, description, details)` for the host."""
    if kind == "function":
        details = {"signature": _signature(obj), "doc": _doc(obj), "is_async": inspect.iscoroutinefunction(obj)}
    elif kind in ("type", "hidden_type"):
        details = {"doc": _doc(obj)}
        if dataclasses.is_dataclass(obj):
            fields = []
            for f in dataclasses.fields(obj):
                has_default = f.default is not dataclasses.MISSING
                fields.append((f.name, _annotation(f.type) or "object", has_default, f.default if has_default else None))
            details["fields"] = fields
        elif isinstance(obj, type) and issubclass(obj, enum.Enum):
            details["members"] = [(m.name, m.value) for m in obj]
        else:
            methods = []
            for method_name, method in vars(obj).items():
                if method_name.startswith("_") or not callable(method):
                    continue
                methods.append((method_name, _signature(method, drop_self=True), _doc(method)))
            details["methods"] = methods
    else:
        details = {}
    return (kind, name, obj, description, details)


_NOT_INJECTED = {str, int, float, bool, bytes, bytearray, list, dict, tuple, set, frozenset, type(None), object, type}
_LIBRARY_MODULES = {"types", "typing", "typing_extensions", "collections.abc", __name__}


def _classes_in(annotation, found):
    """Classes named by an annotation, generic arguments included."""
    import typing

    if isinstance(annotation, type) and not typing.get_args(annotation):
        found.append(annotation)
        return
    origin = typing.get_origin(annotation)
    if isinstance(origin, type):
        found.append(origin)
    for arg in typing.get_args(annotation):
        _classes_in(arg, found)


def _hints(func):
    import typing

    try:
        return list(typing.get_type_hints(func).values())
    except Exception:
        # Resolve each annotation on its own, so one that fails does not hide the others.
        hints = []
        for annotation in getattr(func, "__annotations__", {}).values():
            try:
                if isinstance(annotation, str):
                    annotation = eval(annotation, getattr(func, "__globals__", {}))
                hints.append(annotation)
            except Exception:
                pass
        return hints


def _used_classes(exports):
    """Classes an export needs to be usable (from signatures and values), for hidden binding."""
    found = []
    for kind, _name, obj, _description, _details in exports:
        if kind == "function":
            for hint in _hints(obj):
                _classes_in(hint, found)
        elif kind == "variable" and obj is not None:
            found.append(type(obj))
    usable = []
    for cls in found:
        name = getattr(cls, "__name__", "")
        if (
            cls in _NOT_INJECTED
            or getattr(cls, "__module__", None) in _LIBRARY_MODULES
            or name.startswith("<")
            or not name.isidentifier()
            or keyword.iskeyword(name)
            or cls in [c for _, c in usable]
        ):
            continue
        usable.append((name, cls))
    return usable


def load_exports(path, source=None):
    """Runs a Python file as a module and returns what it exports.

    `source`, when given, is the file's text as the host read it (a sandboxed process may not
    read the file itself); `path` then only names it in tracebacks. With `__exports__` (a list
    of `Function`, `Variable`, `Type` from `cave_agent.runtime`), exactly those; otherwise its
    public top-level functions and classes defined in it.
    """
    import importlib.util
    import os

    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    module_name = f"cave_injection_{stem}"
    if source is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} is not a Python file")
    else:
        spec = importlib.util.spec_from_loader(module_name, loader=None, origin=path)
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs, so that dataclasses with postponed annotations resolve.
    sys.modules[module_name] = module
    try:
        if source is None:
            spec.loader.exec_module(module)
        else:
            import linecache

            module.__file__ = path
            # Tracebacks show the lines without reading the file.
            linecache.cache[path] = (len(source), None, source.splitlines(True), path)
            exec(compile(source, path, "exec"), module.__dict__)
    finally:
        sys.modules.pop(module_name, None)
    exports = getattr(module, "__exports__", None)
    out = []
    if exports is not None:
        for item in exports:
            if isinstance(item, Function):
                out.append(_describe("function", item.name, item.func, item.description))
            elif isinstance(item, Variable):
                out.append(_describe("variable", item.name, item.value, item.description))
            elif isinstance(item, Type):
                out.append(_describe("type", item.name, item.value, item.description))
        exported = {entry[1] for entry in out}
        for name, cls in _used_classes(out):
            if name not in exported:
                out.append(_describe("hidden_type", name, cls, None))
                exported.add(name)
        return out
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
            continue
        if inspect.isfunction(obj):
            out.append(_describe("function", name, obj, None))
        elif inspect.isclass(obj):
            out.append(_describe("type", name, obj, None))
    return out
