"""The worker of cave-agent's kernel runtime: one Python process serving one host.

The host starts this interpreter with a socket on a descriptor of its own and sends frames: a
4-byte big-endian length, then a `marshal` (version 2) tuple `(operation, id, ...)`. Replies and
live output travel back the same way. `marshal` is the whole vocabulary both ways: it holds only
data (None, bool, int, float, str, bytes, tuple, list, dict, set), the host decodes it with its
own strict reader, and this process only loads what the host wrote.

Cells run with the executor (`cave_executor`), exactly as in the in-process runtime. Host
functions and host objects are proxies: a call sends a `call` frame and serves frames until its
reply comes, so a host function may itself run a cell here (nested calls).
"""

import base64
import builtins
import json as _json
import codecs
import itertools
import marshal
import os
import select
import signal
import struct
import sys
import threading
import time
import warnings

import cave_executor as executor

_OUTPUT_CHUNK = 1 << 20
# Python-level output is sent when this much is waiting, or after `_FLUSH_SECONDS`.
_OUTPUT_BATCH = 1 << 16
_FLUSH_SECONDS = 0.02
_pack_length = struct.Struct("<Q").pack_into
# How long a host call polls for its reply before sleeping; and the serve loop for the next
# request, while the host sends them back to back.
_SPIN_SECONDS = 0.0002
# A request that came within this long of the last reply means the host is issuing requests
# back to back (a sequence of operations, a benchmark), not an agent's steps seconds apart.
_BURST_SECONDS = 0.001
_KERNEL_FILE = sys._getframe().f_code.co_filename


class _State:
    fd = -1
    readable = None
    writable = None
    max_frame = 0
    inbox = bytearray()
    send_lock = threading.Lock()
    namespace = {}
    # Objects a Python file defined, by name: they survive a reset, as in the in-process runtime.
    owned = {}
    # The proxy bound for each host object, to tell whether its name still holds it.
    proxies = {}
    # Host call ids: `next` on a count is one step under the GIL, safe from any thread.
    calls = itertools.count(1)
    replies = {}
    abandoned = set()
    # Executions in progress, innermost last (output written to descriptors goes to the last).
    running = []
    # A SIGINT that arrived while a frame was half read or written: raised once that is done.
    pending_interrupt = False
    # When a host call was last answered `KeyboardInterrupt` (the host dropped it because the
    # cell was interrupted): the SIGINT of that same interrupt may still be on its way.
    interrupt_answered = None
    protocol_busy = 0
    main_thread = threading.get_ident()
    # The read end of the pipe behind descriptors 1 and 2, and who may read it.
    pump_fd = -1
    pump_lock = threading.Lock()
    # A pipe that wakes the pump when buffered output starts to wait.
    wake_read = -1
    wake_fd = -1
    # This process is a copy a cell made with `os.fork`.
    forked = False
    # This process is the first worker, the root of the child's process tree (the host's
    # child, a child subreaper): at its first rollback it becomes the reaper (`_REAPER`).
    root = True
    # A pipe on which a copy handing over to the next one tells the root the new server's pid.
    announce = (-1, -1)
    # The pipe to the session's guard (`guard.rs`), -1: none. Every process of the family keeps
    # it, branches too: the guard spares the tree of each branch's keeper announced there.
    guard_fd = -1
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    # The last request followed its predecessor's reply within `_BURST_SECONDS`.
    burst = False
    # The socket on which the host hands over a branch's descriptors (`_fork`); -1: none.
    handover = -1
    # The interpreter's own stderr (the host reads it for a dying process's last words).
    diagnostics = -1


# --- frames ---------------------------------------------------------------------------------


class _Busy:
    """A section of the main thread that must not be cut by `KeyboardInterrupt` (a frame half
    read or written). Signal handlers run only on the main thread, so other threads (the
    descriptor pump) neither count nor receive the deferred interrupt."""

    def __enter__(self):
        if threading.get_ident() == _State.main_thread:
            _State.protocol_busy += 1

    def __exit__(self, *exc):
        if threading.get_ident() != _State.main_thread:
            return
        _State.protocol_busy -= 1
        if _State.pending_interrupt and exc[0] is None:
            _raise_held()


_busy = _Busy()


def _hold_interrupts(step):
    """Holds (`+1`) or stops holding (`-1`) SIGINT on the main thread without raising a held
    one: what is held stays pending for whoever checks it next."""
    if threading.get_ident() == _State.main_thread:
        _State.protocol_busy += step


def _raise_held():
    """Raises the interrupt `_on_sigint` held, if the main thread may take it here: nothing
    holds interrupts and a cell runs."""
    if (
        _State.pending_interrupt
        and not _State.protocol_busy
        and _State.running
        and threading.get_ident() == _State.main_thread
    ):
        _State.pending_interrupt = False
        raise KeyboardInterrupt


# How long after a host call was answered `KeyboardInterrupt` a SIGINT is taken to be that
# same interrupt, arriving late (through a Jupyter server it can trail the answer by a while).
_ANSWERED_INTERRUPT_SECONDS = 2.0


def _on_sigint(_signum, frame):
    # Only a running cell is interrupted; between cells the signal is a late one and is dropped.
    if not _State.running:
        return
    answered = _State.interrupt_answered
    if answered is not None:
        _State.interrupt_answered = None
        if time.monotonic() - answered < _ANSWERED_INTERRUPT_SECONDS:
            # The cell was stopped already, by the host's answer to the call it waited on.
            return
    if _State.protocol_busy or (frame is not None and frame.f_code in _HOLDS_INTERRUPTS):
        _State.pending_interrupt = True
        return
    raise KeyboardInterrupt


class FrameTooLarge(Exception):
    """A frame would exceed the host's limit."""


def _ready():
    """Tells the host this process serves, and what it is."""
    version = sys.version_info
    send(("ready", 0, (version[0], version[1], version[2]), os.getpid(), sys.executable))


def _encode(message):
    body = marshal.dumps(message, 2)
    if len(body) > _State.max_frame:
        raise FrameTooLarge(len(body))
    return len(body).to_bytes(4, "big") + body


def send(message):
    """Sends one frame (from any thread). In a process a cell forked, output goes to the
    captured descriptors instead (where its parent forwards it) and nothing else is sent: the
    socket is the parent's."""
    if _State.forked:
        if message[0] == "out":
            try:
                os.write(1, message[2].encode("utf-8", "replace"))
            except OSError:
                pass
        return
    if _Jupyter.kernel is not None:
        _Jupyter.send(message)
        return
    frame = _encode(message)
    with _busy, _State.send_lock:
        view = memoryview(frame)
        while view:
            try:
                written = os.write(_State.fd, view)
            except BlockingIOError:
                _State.writable.poll()
                continue
            view = view[written:]


def _read_frame(spin=False):
    """The next frame from the host. Only the wait can be interrupted, and it loses no data:
    bytes are kept in the inbox until a whole frame is there. With `spin`, it polls for a
    moment before sleeping: a host call's reply usually comes within microseconds, and waking
    a sleeping process costs more than that."""
    inbox = _State.inbox
    deadline = None
    while True:
        with _busy:
            if len(inbox) >= 4:
                size = int.from_bytes(inbox[:4], "big")
                if size > _State.max_frame:
                    os._exit(70)
                if len(inbox) >= 4 + size:
                    body = inbox[4 : 4 + size]
                    del inbox[: 4 + size]
                    return marshal.loads(body)
            if _Jupyter.kernel is not None:
                # The answer is kept in the inbox before a deferred interrupt is raised.
                inbox += _Jupyter.exchange()
                continue
        if _State.pending_interrupt and _State.running:
            _State.pending_interrupt = False
            raise KeyboardInterrupt
        if not spin:
            _State.readable.poll()
        try:
            chunk = os.read(_State.fd, 1 << 20)
        except BlockingIOError:
            if spin:
                now = time.perf_counter()
                if deadline is None:
                    deadline = now + _SPIN_SECONDS
                if now < deadline:
                    continue
            _State.readable.poll()
            continue
        if not chunk:
            # The host is gone: nothing is left to serve.
            os._exit(0)
        inbox += chunk


# --- the Jupyter transport -------------------------------------------------------------------


def _no_input(prompt=""):
    raise EOFError("EOF when reading a line")


class _Stopped(BaseException):
    """The host said stop to a serve loop it does not own the process of."""


class _HostGone(_Stopped):
    """The host left a prompt unanswered past the orphan timeout (a live one answers every
    heartbeat): the serve loop ends, and the kernel is left idle."""


class _Jupyter:
    """Frames through a Jupyter kernel's stdin channel, for a host that reaches this process
    through Jupyter Server, Kernel Gateway or Enterprise Gateway. The serve loop runs inside
    one execute request that never ends; each `input()` round trip carries this process's
    frames in its prompt and the host's frames in its answer (both framed as on the socket,
    base64, at most `CHUNK` bytes each; `more` asks for the rest). Output goes live on IOPub as
    `stream` messages tagged with their execution, and each prompt says how many characters of
    each execution's output were published, so the host delivers the frames only after that
    output (the channels are not ordered with each other)."""

    kernel = None
    final = False
    CHUNK = 4 << 20
    MARK = "\x00cave "
    outbox = bytearray()
    published = {}
    lock = threading.Lock()
    # Each prompt's number, echoed in its answer: after a lost WebSocket the host sends its last
    # answer again (the first may not have reached the kernel), and a copy that did arrive
    # twice must not be taken for the answer to the next prompt.
    seq = 0
    STALE_ANSWERS = 16
    # When the current prompt was sent (None: no prompt open), and how long one may go
    # unanswered before the host is taken to be gone.
    waiting_since = None
    # A prompt is open (frames sent from now on wait for the next one).
    prompting = False
    orphan_timeout = 600.0
    host_gone = False
    serving = False

    @classmethod
    def send(cls, message):
        if message[0] == "out":
            cls.publish(message[1], message[2])
            return
        frame = _encode(message)
        with cls.lock:
            cls.outbox += frame
            wake = cls.prompting
        if wake:
            # Another thread's prompt is open without this frame: the host answers it at once
            # when told, and the next prompt carries the frame.
            cls.stream("", {"cave_wake": True})

    @classmethod
    def stream(cls, text, metadata):
        """A `stream` message on IOPub (output, or a wake), marked with `metadata`."""
        kernel = cls.kernel
        kernel.session.send(
            kernel.iopub_socket,
            "stream",
            {"name": "stdout", "text": text},
            parent=kernel.get_parent("shell"),
            metadata=metadata,
        )

    @classmethod
    def publish(cls, execution, text):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates: older jupyter_client sessions fail to serialize them (and the
            # output would never arrive); U+FFFD each, as the other transports show them.
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        with cls.lock:
            cls.published[execution] = cls.published.get(execution, 0) + len(text)
        cls.stream(text, {"cave_execution": execution})

    @classmethod
    def exchange(cls, now=False):
        """One round trip: what waits in the outbox (a chunk of it) out, the host's bytes in.
        `now`: the host answers at once, without waiting for frames of its own to send (the
        frames must reach it before what the cell writes next)."""
        if cls.host_gone:
            raise _HostGone()
        with cls.lock:
            chunk = bytes(cls.outbox[: cls.CHUNK])
            del cls.outbox[: cls.CHUNK]
            more = bool(cls.outbox)
            cls.seq += 1
            seq = cls.seq
            cls.prompting = True
            header = {
                "seq": seq,
                "more": more,
                "final": cls.final,
                "now": now,
                "out": {str(k): v for k, v in cls.published.items()},
            }
            # An execution that has ended has given its last count: the header stays small.
            running = set(_State.running)
            for execution in [k for k in cls.published if k not in running]:
                del cls.published[execution]
        prompt = cls.MARK + _json.dumps(header) + "\n" + base64.b64encode(chunk).decode("ascii")
        try:
            for _ in range(cls.STALE_ANSWERS):
                cls.waiting_since = time.monotonic()
                try:
                    answer = cls.kernel.raw_input(prompt)
                finally:
                    cls.waiting_since = None
                if not answer.startswith(cls.MARK):
                    raise RuntimeError("the host answered the Jupyter transport with something else")
                answer_header, _, data = answer[len(cls.MARK) :].partition("\n")
                if _json.loads(answer_header).get("seq", seq) == seq:
                    return base64.b64decode(data)
                # A second copy of an earlier answer: ask again (the host answers a repeated
                # prompt without taking its frames twice).
        finally:
            with cls.lock:
                cls.prompting = False
        raise RuntimeError("the host kept answering earlier prompts on the Jupyter transport")


# --- output ---------------------------------------------------------------------------------


class _Buffered:
    """A cell's Python-level output, sent in pieces of up to 64 KiB: a frame per `print` would
    cost a system call each. It goes out when full, when the cell flushes, ends or calls the
    host, before descriptor output is forwarded (to keep the two in order), and at the latest
    after `_FLUSH_SECONDS` (the descriptor pump's timer), so that output still streams live.
    Until it is sent, a copy waits in the shadow (a memory file the host reads if this process
    dies), so a crash loses none of it."""

    lock = threading.Lock()
    parts = []
    size = 0
    execution = 0
    shadow = None
    shadow_size = 0
    shadow_used = 0


def _flush_output():
    with _Buffered.lock:
        _flush_locked()
    if _State.pending_interrupt:
        _raise_held()


def _flush_locked():
    if not _Buffered.parts:
        return
    text = "".join(_Buffered.parts)
    _Buffered.parts = []
    _Buffered.size = 0
    for start in range(0, len(text), _OUTPUT_CHUNK):
        send(("out", _Buffered.execution, text[start : start + _OUTPUT_CHUNK]))
    _shadow_reset()


def _shadow_reset():
    if _Buffered.shadow is not None:
        _Buffered.shadow[8:16] = bytes(8)
        _Buffered.shadow_used = 0


def _shadow_add(text):
    """Mirrors buffered text into the shadow; False when it does not fit (send it now)."""
    shadow = _Buffered.shadow
    if shadow is None:
        return True
    data = text.encode("utf-8", "surrogatepass")
    used = _Buffered.shadow_used
    end = used + len(data)
    if 16 + end > _Buffered.shadow_size:
        return False
    shadow[16 + used : 16 + end] = data
    _Buffered.shadow_used = end
    _pack_length(shadow, 8, end)
    return True


def _writer(execution):
    def write(text):
        with _Buffered.lock:
            if _Buffered.execution != execution:
                _flush_locked()
                _Buffered.execution = execution
                if _Buffered.shadow is not None:
                    _Buffered.shadow[0:8] = execution.to_bytes(8, "little")
            started = not _Buffered.parts
            if not _shadow_add(text):
                _flush_locked()
                if not _shadow_add(text):
                    # Larger than the shadow: sent at once, unbuffered.
                    for start in range(0, len(text), _OUTPUT_CHUNK):
                        send(("out", execution, text[start : start + _OUTPUT_CHUNK]))
                    return
                started = True
            _Buffered.parts.append(text)
            _Buffered.size += len(text)
            if _Buffered.size >= _OUTPUT_BATCH:
                _flush_locked()
                return
        if started:
            # Wake the pump, whose timer sends what is still here after a moment.
            try:
                os.write(_State.wake_fd, b"w")
            except OSError:
                pass
        if _State.pending_interrupt:
            _raise_held()

    write.flush = _flush_output
    return write


def _pump(read_fd):
    """Forwards what is written to descriptors 1 and 2 to the running execution (0: none),
    and sends buffered Python output that has waited long enough."""
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    poller.register(_State.wake_read, select.POLLIN)
    while True:
        timeout = int(_FLUSH_SECONDS * 1000) if _Buffered.parts else None
        try:
            ready = poller.poll(timeout)
        except InterruptedError:
            continue
        woken = any(fd == _State.wake_read for fd, _ in ready)
        if woken:
            try:
                os.read(_State.wake_read, 4096)
            except OSError:
                pass
        if not ready or not woken:
            try:
                _flush_output()
            except Exception:
                pass
        if any(fd == read_fd for fd, _ in ready) and not _drain():
            return


def _drain():
    """Reads and forwards what the capture pipe holds now; False once it is closed. The lock
    makes a drain at the end of a cell wait for one the pump has begun, so nothing written
    during the cell arrives after it."""
    with _State.pump_lock:
        while True:
            try:
                data = os.read(_State.pump_fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            _forward(_State.decoder.decode(data))


def _forward(text):
    if not text:
        return
    # Python output written before this descriptor output goes first.
    _flush_output()
    running = _State.running
    execution = running[-1] if running else 0
    try:
        for start in range(0, len(text), _OUTPUT_CHUNK):
            send(("out", execution, text[start : start + _OUTPUT_CHUNK]))
    except Exception:
        pass


def _capture_descriptors():
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    os.set_inheritable(read_fd, False)
    os.set_blocking(read_fd, False)
    _State.pump_fd = read_fd
    _State.wake_read, _State.wake_fd = os.pipe()
    for fd in (_State.wake_read, _State.wake_fd):
        os.set_inheritable(fd, False)
        os.set_blocking(fd, False)
    threading.Thread(target=_pump, args=(read_fd,), name="cave-descriptors", daemon=True).start()


# --- host calls -----------------------------------------------------------------------------


def host_call(handle, method, bound):
    """Calls host function or object `handle` with bound arguments `[(name, value), ...]`."""
    args = []
    for name, value in bound:
        try:
            args.append((name, executor.plain(value)))
        except executor.Unsupported as error:
            raise TypeError(
                f"argument '{name}' is a {error}, which cannot be passed to a host function: "
                "pass plain data (numbers, str, bytes, list, tuple, dict, set)"
            ) from None
    _flush_output()
    call = next(_State.calls)
    try:
        send(("call", call, handle, method, args))
    except FrameTooLarge as error:
        raise ValueError(
            f"the arguments are {error.args[0]} bytes once encoded, over the runtime's frame limit of "
            f"{_State.max_frame} bytes"
        ) from None
    try:
        ok, payload = _serve(until=call)
    except BaseException:
        # Interrupted while waiting: the reply, when it comes, has nobody to go to.
        with _reader.lock:
            if _State.replies.pop(call, None) is None:
                _State.abandoned.add(call)
        raise
    if ok:
        if _State.pending_interrupt:
            _raise_held()
        return payload
    python_type, message = payload
    kind = getattr(builtins, python_type, None)
    # KeyboardInterrupt: the host dropped the call because the cell was interrupted (its answer
    # can come before the interrupt itself reaches this process, as through Enterprise Gateway).
    if kind is KeyboardInterrupt:
        _State.interrupt_answered = time.monotonic()
        raise KeyboardInterrupt(message)
    if isinstance(kind, type) and issubclass(kind, Exception):
        raise kind(message)
    raise RuntimeError(f"{python_type}: {message}")


# --- resources ------------------------------------------------------------------------------


def _make(spec, created):
    """The object of one resource spec, and the names bound beside it when free."""
    kind, name = spec[0], spec[1]
    if kind == "value":
        value, record = spec[2], spec[3]
        if record is not None and isinstance(value, dict):
            cls = created.get(record) or _State.namespace.get(record)
            if cls is not None:
                return cls(**value), []
        return value, []
    if kind == "function":
        params, doc, is_async, handle = spec[2:6]
        call = lambda bound, handle=handle: host_call(handle, None, bound)  # noqa: E731
        return executor.make_function(name, params, doc, is_async, call), []
    if kind == "source":
        scope = {}
        exec(compile(spec[2], f"<cave {name}>", "exec"), _State.namespace, scope)
        if name not in scope:
            raise RuntimeError(f"the Python source of function '{name}' does not define '{name}'")
        function = scope.pop(name)
        return function, list(scope.items())
    if kind == "owned":
        if name not in _State.owned:
            raise RuntimeError(f"no Python object was loaded for '{name}'")
        return _State.owned[name], []
    if kind == "record":
        return executor.make_record(name, spec[2], spec[3]), []
    if kind == "enum":
        return executor.make_enum(name, spec[2], spec[3]), []
    if kind == "class":
        return type(name, (), {"__doc__": spec[2]}), []
    if kind == "object":
        type_name, doc, methods, handle = spec[2:6]
        call = lambda method, bound, handle=handle: host_call(handle, method, bound)  # noqa: E731
        proxy = executor.make_object(type_name, doc, methods, call)
        return proxy, [(type_name, type(proxy))]
    raise ValueError(f"unknown resource kind {kind!r}")


def _bind(specs, reserved):
    """Binds a batch: every object is created first; the namespace changes only when all could
    be. Returns None, or `(name, message)` of the resource that failed."""
    created = {}
    made = []
    for spec in specs:
        try:
            obj, extra = _make(spec, created)
        except BaseException as error:  # a host value or source may raise anything
            return (spec[1], f"{type(error).__name__}: {error}")
        created[spec[1]] = obj
        made.append((spec, obj, extra))
    ns = _State.namespace
    for spec, obj, extra in made:
        companions = []
        for extra_name, extra_obj in extra:
            if extra_name not in reserved and extra_name not in ns:
                ns[extra_name] = extra_obj
                companions.append(extra_obj)
        ns[spec[1]] = obj
        # Not a variable: a function, a type or an object (one loaded from a file: a callable).
        watched = spec[0] != "value" and (spec[0] != "owned" or callable(obj))
        executor.host_bound(ns, spec[1], obj, watched, companions)
        if spec[0] == "object":
            _State.proxies[spec[1]] = obj
    return None


# --- checkpoints ----------------------------------------------------------------------------


class _Checkpoints:
    """Paused copies of this process, by checkpoint id: `(pid, write end of its resume pipe)`.
    A copy holds the write ends of the checkpoints older than itself, so that it can roll back
    further once it serves; it ends when every process holding its pipe has gone."""

    table = {}


def _checkpoint(checkpoint_id):
    """Forks a paused copy of this process, the state to return to; returns `(pid of the
    copy, None)`. In a copy a rollback made the worker, it returns `(pid of a fresh copy for
    the same checkpoint, id of the rollback request)`: the copy answers the rollback once it
    serves, and rolling back does not use the checkpoint up. A loop, not a recursion: a
    checkpoint may be rolled back to any number of times."""
    _flush_output()
    _drain()
    rollback_request = None
    while True:
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns about forking a threaded process; the copy restarts the
            # threads it needs, with fresh locks.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid != 0:
            os.close(read_fd)
            os.set_inheritable(write_fd, False)
            _Checkpoints.table[checkpoint_id] = (pid, write_fd)
            return pid, rollback_request
        # The at-fork hook took this for a cell's fork; it is not.
        _State.forked = False
        _State.root = False
        os.close(write_fd)
        rollback_request = _paused(read_fd)
        _resumed()


def _paused(read_fd):
    """Waits for the worker to hand over (the id of its rollback request, 8 bytes), or exits
    when it and every later copy are gone (end of file): nothing runs here meanwhile."""
    data = b""
    while len(data) < 8:
        try:
            chunk = os.read(read_fd, 8 - len(data))
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
        if not chunk:
            os._exit(0)
        data += chunk
    os.close(read_fd)
    return int.from_bytes(data, "little")


def _resumed():
    """Becomes the worker: fresh locks (a thread of the old worker may have held them at the
    fork), an empty inbox (its bytes were served by the old worker), and the descriptor pump
    and the host watch again (threads do not survive a fork)."""
    _State.send_lock = threading.Lock()
    _State.pump_lock = threading.Lock()
    _Buffered.lock = threading.Lock()
    _fresh_reader()
    _State.main_thread = threading.get_ident()
    threading.Thread(target=_pump, args=(_State.pump_fd,), name="cave-descriptors", daemon=True).start()
    threading.Thread(target=_watch_host, name="cave-host-watch", daemon=True).start()


def _watch_host():
    """Exits when the host's end of the socket closes. The first worker dies with the host
    through its parent-death signal; a copy that took over has no such tie (its parent is
    gone), and a cell that never returns to read the socket would otherwise outlive the host."""
    _wait_for_hangup(_State.fd)
    os._exit(0)


def _wait_for_hangup(fd):
    """Returns once the other end of socket `fd` has closed."""
    hangup = select.POLLHUP | getattr(select, "POLLRDHUP", 0)
    poller = select.poll()
    poller.register(fd, getattr(select, "POLLRDHUP", 0))
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        if any(event & hangup for _fd, event in events):
            return


def _rollback(request_id, checkpoint_id):
    """Hands the host over to the copy made at `checkpoint_id`, which answers the request, and
    ends this process. The checkpoints made after it are dropped: they describe a future that
    is being undone."""
    entry = _Checkpoints.table.get(checkpoint_id)
    if entry is None:
        _reply(request_id, "failed", f"no checkpoint {checkpoint_id} in this process")
        return
    for other in [k for k in _Checkpoints.table if k > checkpoint_id]:
        _drop_checkpoint(other)
    _flush_output()
    _drain()
    # Nothing more of this process reaches the socket: the copy owns it from here.
    _State.send_lock.acquire()
    _Buffered.lock.acquire()
    try:
        if not _State.root:
            # Told before this process ends, so that the root knows its end is a hand-over.
            os.write(_State.announce[1], entry[0].to_bytes(8, "little"))
        os.write(entry[1], request_id.to_bytes(8, "little"))
        if _State.root:
            _become_reaper(entry[0])
    finally:
        os._exit(0)


# The first worker after its first hand-over: it stays the root of the child's process tree (a
# child subreaper keeps that across `exec`), reaps every process of the session that ends there
# (a copy that handed over has no parent left to reap it, and not every init reaps at once:
# the control group counts zombies against the process limit), and ends as the serving process
# ends, with its status: that is what the host waits for. Its pid is learnt from the hand-overs
# announced on a pipe (argv[1]), the first one given (argv[2]).
_REAPER = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
announced = int(sys.argv[1])
server = int(sys.argv[2])
os.set_blocking(announced, False)
pending = b""
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        os._exit(0)
    try:
        pending += os.read(announced, 4096)
    except OSError:
        pass
    while len(pending) >= 8:
        server = int.from_bytes(pending[:8], "little")
        pending = pending[8:]
    if pid == server:
        if os.WIFSIGNALED(status):
            try:
                signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            except (OSError, ValueError):
                pass
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
"""


def _become_reaper(server):
    """The root hands over: it becomes `_REAPER` in an interpreter of its own, so that the state
    it held is freed."""
    os.set_inheritable(_State.announce[0], True)
    os.execv(
        sys.executable,
        [sys.executable, "-S", "-c", _REAPER, str(_State.announce[0]), str(server)],
    )


def _drop_checkpoint(checkpoint_id):
    """Ends the copy of a checkpoint the host no longer holds."""
    entry = _Checkpoints.table.pop(checkpoint_id, None)
    if entry is None:
        return
    try:
        os.kill(entry[0], signal.SIGKILL)
        os.waitpid(entry[0], 0)
    except OSError:
        pass
    os.close(entry[1])


# --- branches -------------------------------------------------------------------------------

# What the host hands over for a branch, in order; the control group's member list comes last
# when the branch has a control group.
_BRANCH_FDS = ("socket", "handover", "shadow", "stderr", "status")


def _fork(request_id, directory, source):
    """Forks a branch: a copy of this process that the host serves as a runtime of its own, on
    the descriptors it handed over just before this request (`_BRANCH_FDS`), working in
    `directory` (where it copies the files of `source`, this one's) unless it is empty.
    Answers the pid
    of the branch's keeper (`_keep_branch`), the process the host moves into the branch's
    control group before the branch's worker is forked from it."""
    import socket

    if _State.handover < 0:
        _reply(request_id, "failed", "this process has no hand-over socket: it cannot fork")
        return
    try:
        handover = socket.socket(fileno=os.dup(_State.handover))
        try:
            _data, fds, _flags, _address = socket.recv_fds(handover, 1, len(_BRANCH_FDS) + 1)
        finally:
            handover.close()
    except OSError as error:
        _reply(request_id, "failed", f"the branch's descriptors did not arrive: {error}")
        return
    if len(fds) < len(_BRANCH_FDS):
        for fd in fds:
            os.close(fd)
        _reply(request_id, "failed", f"{len(fds)} descriptors arrived for the branch, not {len(_BRANCH_FDS)}")
        return
    _flush_output()
    _drain()
    import gc

    # The objects there are now stay out of the branch's collections (Python's advice for
    # forking servers): a full collection in the branch would write to, and so copy, the page
    # of every object the namespace holds. This process collects them again at once.
    gc.freeze()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid != 0:
        gc.unfreeze()
        for fd in fds:
            os.close(fd)
        # The keeper is this process's child until it ends: reaped here, not left a zombie.
        threading.Thread(target=_reap, args=(pid,), name="cave-branch-reaper", daemon=True).start()
        if _State.guard_fd >= 0:
            # The guard kills what is beneath it when this session ends, but not a branch.
            try:
                os.write(_State.guard_fd, (-pid).to_bytes(8, "little", signed=True))
            except OSError:
                pass
        _reply(request_id, "ok", pid)
        return
    try:
        _State.forked = False
        _keep_branch(fds, directory, source)
    finally:
        os._exit(70)


def _reap(pid):
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass


# Where a work directory keeps its branches' directories (`BRANCHES_DIR` in the host).
_BRANCHES_DIR = ".cave-branches"


def _copy_work_dir(source, target):
    """Copies the files, directories and links beneath `source` into `target` (the branches'
    directories left out), here in the sandbox rather than in the host: a link a cell left is
    copied as a link, never followed, and nothing the sandbox keeps from this process is read.
    Pipes and other special files are left out. Walked with a list: no recursion."""
    import shutil
    import stat

    pending = [(source, target, True)]
    while pending:
        here, there, top = pending.pop()
        with os.scandir(here) as entries:
            for entry in entries:
                if top and entry.name == _BRANCHES_DIR:
                    continue
                destination = os.path.join(there, entry.name)
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    os.symlink(os.readlink(entry.path), destination)
                elif stat.S_ISDIR(mode):
                    os.mkdir(destination)
                    pending.append((entry.path, destination, False))
                elif stat.S_ISREG(mode):
                    shutil.copyfile(entry.path, destination, follow_symlinks=False)
                    shutil.copymode(entry.path, destination, follow_symlinks=False)


def _move_packages(source, target):
    """A branch's session environment is its copy in `target`: the paths that named the one
    under `source` (on `sys.path`, `PIP_PREFIX`, `PATH`) name it instead."""
    source = source.rstrip(os.sep)
    prefix = os.environ.get("PIP_PREFIX")
    if not prefix or not prefix.startswith(source + os.sep):
        return

    def moved(path):
        if path.startswith(source + os.sep):
            return target.rstrip(os.sep) + path[len(source) :]
        return path

    sys.path[:] = [moved(p) for p in sys.path]
    os.environ["PIP_PREFIX"] = moved(prefix)
    os.environ["PATH"] = os.pathsep.join(
        moved(p) for p in os.environ.get("PATH", "").split(os.pathsep)
    )
    sys.path_importer_cache.clear()
    import importlib

    importlib.invalidate_caches()


def _close_all_but(kept):
    """Closes every descriptor from 3 up but those in `kept`."""
    start = 3
    for fd in sorted(fd for fd in kept if fd >= 3):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, min(os.sysconf("SC_OPEN_MAX"), 1 << 20))


def _keep_branch(fds, directory, source):
    """The branch's first process: a session of its own (the parent's process-group kill does
    not reach it), moved into the branch's control group by the host, then the parent of the
    branch's worker. It tells the host the worker's pid and, once the worker has ended, its
    wait status (the host cannot wait for a process that is not its child); when the host's
    end of the socket closes first (the host stopped or died), it kills the worker and the
    group's members."""
    sock, handover, shadow, stderr, status = fds[:5]
    members = fds[5] if len(fds) > 5 else -1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setsid()
    # The host moves this process into the branch's control group, then says go.
    if os.read(handover, 1) != b"g":
        os._exit(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        worker = os.fork()
    if worker == 0:
        try:
            _State.forked = False
            os.close(status)
            if members >= 0:
                os.close(members)
            _become_branch(sock, handover, shadow, stderr, directory, source)
        finally:
            os._exit(70)
    # Nothing here makes garbage cycles, and a collection would write to (and so copy) the
    # page of every object the parent's namespace holds.
    import gc

    gc.disable()
    os.write(status, worker.to_bytes(4, "little"))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _close_all_but({sock, status, members})
    code = _wait_for_worker_or_hangup(sock, worker)
    if code is None:
        # The host's end closed first: the worker and what its cells started go.
        try:
            os.kill(worker, signal.SIGKILL)
        except OSError:
            pass
        _kill_members(members)
        os._exit(0)
    try:
        os.write(status, code.to_bytes(4, "little", signed=True))
    except OSError:
        pass
    os._exit(0)


def _wait_for_worker_or_hangup(sock, worker):
    """In a branch's keeper: the worker's wait status once it ends, or None once the host's end
    of socket `sock` closes first. One thread: a process descriptor for the worker where the
    system has them (Linux 5.3 and later), else a thread that watches the socket."""
    try:
        pidfd = os.pidfd_open(worker)
    except (AttributeError, OSError):
        pidfd = -1
    if pidfd < 0:
        hung_up = threading.Event()

        def watch():
            _wait_for_hangup(sock)
            hung_up.set()
            try:
                os.kill(worker, signal.SIGKILL)
            except OSError:
                pass

        threading.Thread(target=watch, daemon=True).start()
        code = _reap_code(worker)
        return None if hung_up.is_set() else code
    hangup = select.POLLHUP | getattr(select, "POLLRDHUP", 0)
    poller = select.poll()
    poller.register(sock, getattr(select, "POLLRDHUP", 0))
    poller.register(pidfd, select.POLLIN)
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, event in events:
            if fd == pidfd:
                return _reap_code(worker)
            if event & hangup:
                return None


def _reap_code(pid):
    """The wait status of child `pid`, once it has ended."""
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


def _kill_members(members):
    """Kills every process listed in the control group's member list (`members`, an open
    descriptor; -1: no group) but this one, in rounds until none is left (the same as the first
    worker's keeper in the bootstrap, which runs before this module exists)."""
    for _ in range(50 if members >= 0 else 0):
        try:
            others = [int(p) for p in os.pread(members, 1 << 20, 0).split() if int(p) != os.getpid()]
        except (OSError, ValueError):
            break
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _become_branch(sock, handover, shadow, stderr, directory, source):
    """Makes this copy a worker of its own: the branch's socket, hand-over socket, output
    shadow and stderr in place of the parent's; fresh pipes for the output of descriptors 1
    and 2; none of the parent's checkpoints; then says it is ready and serves."""
    os.dup2(sock, _State.fd)
    os.close(sock)
    os.set_inheritable(_State.fd, False)
    os.set_blocking(_State.fd, False)
    os.dup2(handover, _State.handover)
    os.close(handover)
    os.set_inheritable(_State.handover, False)
    if _State.diagnostics >= 0:
        os.dup2(stderr, _State.diagnostics)
        os.set_inheritable(_State.diagnostics, False)
    os.close(stderr)
    old_shadow = _Buffered.shadow
    try:
        import mmap

        _Buffered.shadow = mmap.mmap(shadow, _Buffered.shadow_size)
    except (ImportError, OSError, ValueError):
        _Buffered.shadow = None
    os.close(shadow)
    if old_shadow is not None:
        old_shadow.close()
    _Buffered.lock = threading.Lock()
    _Buffered.parts = []
    _Buffered.size = 0
    _Buffered.shadow_used = 0
    for _pid, write_fd in _Checkpoints.table.values():
        os.close(write_fd)
    _Checkpoints.table.clear()
    for fd in (*_State.announce, _State.pump_fd, _State.wake_read, _State.wake_fd):
        if fd == _State.guard_fd:
            continue
        try:
            os.close(fd)
        except OSError:
            pass
    _State.announce = os.pipe()
    _State.root = True
    _State.send_lock = threading.Lock()
    _State.pump_lock = threading.Lock()
    _fresh_reader()
    _State.running = []
    _State.pending_interrupt = False
    _State.protocol_busy = 0
    _State.main_thread = threading.get_ident()
    _State.readable = select.poll()
    _State.readable.register(_State.fd, select.POLLIN)
    _State.writable = select.poll()
    _State.writable.register(_State.fd, select.POLLOUT)
    if directory:
        _copy_work_dir(source, directory)
        os.chdir(directory)
        _move_packages(source, directory)
    signal.signal(signal.SIGINT, _on_sigint)
    _capture_descriptors()
    threading.Thread(target=_watch_host, name="cave-host-watch", daemon=True).start()
    _ready()
    # This process serves from here, not from inside the request that forked it.
    _reader.main_serving = []
    _serve()


# --- requests -------------------------------------------------------------------------------


def _shower(execution):
    """Sends the items execution `execution` shows, after the output written before them."""

    def show(bundle, omitted):
        _flush_output()
        try:
            send(("display", execution, bundle, omitted))
            if _Jupyter.kernel is not None:
                # Frames wait for the next round trip there: this one goes now, so that the
                # item comes before what the cell writes after it.
                with _busy:
                    _State.inbox += _Jupyter.exchange(now=True)
        except FrameTooLarge:
            # Over the frame limit (set lower than the display limit): its text, and the rest
            # named as left out.
            text = bundle.get("text/plain", "")[:4096]
            left_out = dict(omitted)
            for mime, data in bundle.items():
                if mime != "text/plain":
                    left_out[mime] = len(data)
            send(("display", execution, {"text/plain": text}, left_out))

    # One interpreter per runtime: every cell's figures are the runtime's.
    show.owner = _State
    return show


def _execute(request_id, code, number, display_limit=None, split=None):
    write = _writer(request_id)
    _State.running.append(request_id)
    held = 0
    unreported = None
    try:
        try:
            if _State.pending_interrupt:
                _raise_held()  # one that landed in this frame as the cell began
            raised = executor.run_cell(
                code,
                _State.namespace,
                f"<cell {number}>",
                write,
                _shower(request_id),
                display_limit,
                split,
            )
        except BaseException as error:  # an interrupt that landed in the executor's own frames
            raised = (type(error).__name__, str(error))
            unreported = f"{raised[0]}: {raised[1]}\n"
        # What the cell wrote (buffered, and to descriptors 1 and 2) is its output, all of it
        # before "done". An interrupt that arrives from here on was meant for code that has
        # ended (the host's second SIGINT, or a Jupyter kernel's interrupt that trails the
        # host's answer to a dropped host call): held like one inside a frame, then dropped
        # below, so it neither cuts the output nor escapes this function, whose caller would
        # die of it. One landing between these statements is held by `_on_sigint`.
        _hold_interrupts(+1)
        held = 1
        if unreported is not None:
            write(unreported)
        _flush_output()
        _drain()
    finally:
        _State.running.pop()
        if not _State.running:
            _State.pending_interrupt = False
        _hold_interrupts(-held)
    if raised is not None and raised[0] == "KeyboardInterrupt" and not _State.running:
        # The interrupt may have landed inside importlib and left its locks held by this
        # thread, which would stop every later import (the in-process runtime does the same).
        executor.release_import_locks()
    _answering(request_id)
    send(("done", request_id, raised))


def _answering(request_id):
    """The main thread is about to answer `request_id` (or is done with it): from now on a
    request another thread reads is the main thread's (`_Reader`)."""
    if threading.get_ident() != _State.main_thread:
        return
    with _reader.lock:
        serving = _reader.main_serving
        if serving and serving[-1] == request_id:
            serving.pop()


def _get(name):
    if name not in _State.namespace:
        return ("unbound", None)
    try:
        return ("ok", executor.plain(_State.namespace[name]))
    except executor.Unsupported as error:
        return ("unsupported", str(error))


def _reply(request_id, status, payload):
    _answering(request_id)
    try:
        send(("reply", request_id, status, payload))
    except FrameTooLarge as error:
        send(("reply", request_id, "too_large", error.args[0]))


def _handle(message):
    operation, request_id = message[0], message[1]
    if operation == "execute":
        _execute(request_id, message[2], message[3], *message[4:6])
    elif operation == "bind":
        failed = _bind(message[2], set(message[3]))
        _reply(request_id, "ok" if failed is None else "failed", failed)
    elif operation == "get":
        status, payload = _get(message[2])
        _reply(request_id, status, payload)
    elif operation == "bind_unique":
        prefix, start, value, taken = message[2:6]
        index = executor.free_name(_State.namespace, prefix, start, set(taken))
        _State.namespace[f"{prefix}_{index}"] = value
        _reply(request_id, "ok", index)
    elif operation == "bind_unique_file":
        # A cell's whole output, which the host wrote to a file this process can read.
        prefix, start, path, taken = message[2:6]
        try:
            with open(path, encoding="utf-8", newline="") as file:
                value = file.read()
        except Exception as error:  # noqa: BLE001 - unreadable or too large: the host says so
            _reply(request_id, "failed", f"{type(error).__name__}: {error}")
            return
        index = executor.free_name(_State.namespace, prefix, start, set(taken))
        _State.namespace[f"{prefix}_{index}"] = value
        _reply(request_id, "ok", index)
    elif operation == "is_bound":
        _reply(request_id, "ok", message[2] in _State.namespace)
    elif operation == "is_proxy":
        name = message[2]
        proxy = _State.proxies.get(name)
        _reply(request_id, "ok", proxy is not None and _State.namespace.get(name) is proxy)
    elif operation == "load":
        try:
            exports = executor.load_exports(message[2], message[3])
            _State.owned.update((name, obj) for _kind, name, obj, _description, _details in exports)
            described = executor.describe_exports(exports)
        except BaseException as error:  # the file's own code may raise anything
            _reply(request_id, "failed", f"{type(error).__name__}: {error}")
        else:
            _reply(request_id, "ok", described)
    elif operation == "checkpoint":
        pid, rollback_request = _checkpoint(message[2])
        # In a copy that took over, the request being answered is the rollback.
        _reply(request_id if rollback_request is None else rollback_request, "ok", pid)
    elif operation == "rollback":
        _rollback(request_id, message[2])
    elif operation == "drop_checkpoint":
        _drop_checkpoint(message[2])
    elif operation == "fork":
        _fork(request_id, message[2], message[3])
    elif operation == "stop":
        _reply(request_id, "ok", None)
        if _Jupyter.kernel is not None:
            # The kernel is not ours to end: the answer goes out, and the serve loop returns.
            _Jupyter.final = True
            _Jupyter.exchange()
            raise _Stopped
        os._exit(0)
    else:
        _reply(request_id, "failed", f"unknown operation {operation!r}")


class _Reader:
    """Who reads the socket. Several threads may wait for replies at once (a cell's threads,
    `asyncio.gather` over host calls), but one reads at a time: the others wait on `cond` for
    a reply the reader files under their call's id, or for their turn to read. A request the
    reader is not the main thread for goes to the main thread when it waits here (between
    cells, or in a host call of its own), so that cells run where SIGINT reaches them;
    otherwise (a request nested in a host call while the main thread runs the cell) the
    thread that read it serves it. Whether the main thread runs a request is `main_serving`,
    the ids of the requests it has taken and not yet answered, kept under `cond`: the host
    sends the next cell as soon as a cell's answer reaches it, and a thread of that cell may
    read it before the main thread is back here to wait; it is still the main thread's."""

    # One instance, `_reader`: attributes of an instance are cheap to set, a class's are not
    # (setting one invalidates the type's attribute cache). `cond` waits on `lock`, a plain
    # lock taken alone (`with lock`, in C) on the path of every host call, and `cond` is
    # notified only when some thread waits (`waiting`): a call costs about what it cost when
    # one thread read.
    __slots__ = ("lock", "cond", "waiting", "reading", "main_waiting", "main_serving", "for_main")

    def __init__(self, main_serving=()):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.waiting = 0
        self.reading = False
        self.main_waiting = False
        self.main_serving = list(main_serving)
        self.for_main = []


_reader = _Reader()


def _fresh_reader():
    """After a fork: no thread of the old worker reads, or waits, in this process (the main
    thread's `main_serving` stays: it is inside the request that forked)."""
    global _reader
    _reader = _Reader(_reader.main_serving)
    _State.inbox = bytearray()
    _State.replies = {}
    _State.abandoned = set()


def _next_message(until, main):
    """The reply to host call `until` as `(True, reply)`, or a request to serve as
    `(False, message)`."""
    reader = _reader
    with reader.lock:
        while True:
            if until is not None and until in _State.replies:
                return True, _State.replies.pop(until)
            if main and reader.for_main:
                message = reader.for_main.pop(0)
                reader.main_serving.append(message[1])
                return False, message
            if not reader.reading:
                reader.reading = True
                break
            if main:
                reader.main_waiting = True
            reader.waiting += 1
            try:
                reader.cond.wait()
            finally:
                reader.waiting -= 1
                if main:
                    reader.main_waiting = False
    while True:
        try:
            if until is None:
                waited = time.perf_counter()
                message = _read_frame(spin=_State.burst)
                _State.burst = time.perf_counter() - waited < _BURST_SECONDS
            else:
                message = _read_frame(spin=True)
        except BaseException:
            # Interrupted while reading (nothing was lost: the inbox keeps a partial frame).
            with reader.lock:
                reader.reading = False
                if reader.waiting:
                    reader.cond.notify_all()
            raise
        with reader.lock:
            if message[0] == "return":
                call = message[1]
                if call == until:
                    reader.reading = False
                    if reader.waiting:
                        reader.cond.notify_all()
                    return True, (message[2], message[3])
                if call in _State.abandoned:
                    _State.abandoned.discard(call)
                elif reader.waiting:
                    _State.replies[call] = (message[2], message[3])
                    reader.cond.notify_all()
                else:
                    _State.replies[call] = (message[2], message[3])
                continue
            if not main and (reader.main_waiting or not reader.main_serving):
                reader.for_main.append(message)
                if reader.waiting:
                    reader.cond.notify_all()
                continue
            if main:
                reader.main_serving.append(message[1])
            reader.reading = False
            if reader.waiting:
                reader.cond.notify_all()
            return False, message


def _serve(until=None):
    """Serves requests; with `until`, returns the reply to that host call when it comes."""
    main = threading.get_ident() == _State.main_thread
    while True:
        if _State.forked:
            # A copy made by `os.fork` in a cell, back from the cell: it has nothing to serve.
            os._exit(0)
        is_reply, message = _next_message(until, main)
        if is_reply:
            return message
        try:
            _handle(message)
        except Exception as error:  # a request that failed here must not end the process
            _reply(message[1], "failed", f"{type(error).__name__}: {error}")
        finally:
            if main:
                _answering(message[1])


# The worker's own functions where `KeyboardInterrupt` must not be raised between two of their
# statements: around a cell (where nothing would catch it), and where they take a lock with
# `with` (Python 3.9 can raise between a `with` block's end and its `__exit__`, and the lock
# would stay taken for good) or keep state that other threads read. A SIGINT that lands while
# one of them is the innermost frame is held (`_on_sigint`) and raised at the next place that
# may (`_raise_held`): the end of a frame sent or read, of a write, of a host call.
_HOLDS_INTERRUPTS = frozenset(
    function.__code__
    for function in (
        _execute,
        _hold_interrupts,
        _writer(0),
        _flush_output,
        _drain,
        _answering,
        _next_message,
        host_call,
        _Jupyter.send,
        _Jupyter.publish,
        _Jupyter.exchange,
    )
)


def _forked():
    _State.forked = True
    _State.running = []


def _watch_jupyter_host(main_thread):
    """The Jupyter transport's `_watch_host` (it has no socket that hangs up): ends the serve
    loop, raising `_HostGone` in the thread waiting for an answer, once a prompt has gone
    unanswered for the orphan timeout: the host died or cannot reach the kernel, and a busy
    kernel would never be culled by its server."""
    import ctypes

    period = min(5.0, _Jupyter.orphan_timeout / 4)
    while _Jupyter.serving:
        time.sleep(period)
        since = _Jupyter.waiting_since
        if since is not None and time.monotonic() - since > _Jupyter.orphan_timeout:
            _Jupyter.host_gone = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(main_thread), ctypes.py_object(_HostGone)
            )
            return


def _quiet_fork_warning():
    """Python 3.12+ warns a cell that forks when the process has other threads; here they are
    the worker's own (the descriptor pump, the host watch), which hold no lock a child needs,
    and the model can do nothing about them: the warning would only be noise in its output."""
    warnings.filterwarnings(
        "ignore",
        message=r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks",
        category=DeprecationWarning,
    )


def main_jupyter(kernel, max_frame, attached, orphan_timeout=600.0):
    """Serves the host through `kernel` (an ipykernel `Kernel`), inside the execute request
    that bootstrapped this module, until the host says stop or stops answering for
    `orphan_timeout` seconds. In a kernel the host `attached` to, cells run in the kernel's own
    namespace, with what its user left there."""
    _Jupyter.kernel = kernel
    _Jupyter.orphan_timeout = orphan_timeout
    _Jupyter.serving = True
    threading.Thread(
        target=_watch_jupyter_host,
        args=(threading.get_ident(),),
        name="cave-host-watch",
        daemon=True,
    ).start()
    _State.max_frame = max_frame
    # As in a child, whose stdin is /dev/null: a cell's input() has nobody to answer it (the
    # stdin channel carries the runtime's frames).
    builtins.input = _no_input
    _capture_descriptors()
    _quiet_fork_warning()
    # The kernel's own `display` and inline backend publish on IOPub, which the runtime does
    # not read: cells get the executor's while the worker serves (the kernel's come back after).
    kernel_display = getattr(builtins, "display", None)
    kernel_backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "module://cave_matplotlib"
    executor.install()
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.switch_backend("module://cave_matplotlib")
    executor.hide_frames_of(_KERNEL_FILE)
    if attached:
        _State.namespace = kernel.shell.user_ns
    else:
        executor.reset_namespace(_State.namespace)
    signal.signal(signal.SIGINT, _on_sigint)
    os.register_at_fork(after_in_child=_forked)
    _ready()
    try:
        _serve()
    except _Stopped:
        pass
    finally:
        _Jupyter.serving = False
        if kernel_display is not None:
            builtins.display = kernel_display
        if kernel_backend is not None:
            os.environ["MPLBACKEND"] = kernel_backend


def _use_packages():
    """With an egress allowlist the host names, in `CAVE_PACKAGES`, the session's environment
    under the work directory: `pip install` in a cell installs there (`PIP_PREFIX`; the
    interpreter's own site-packages are read-only in the sandbox), its site directories come
    before the interpreter's on `sys.path` (made now: a directory missing at the first import
    is never looked in again), and its scripts first on `PATH`."""
    name = os.environ.pop("CAVE_PACKAGES", None)
    if not name:
        return
    import sysconfig

    prefix = os.path.abspath(name)
    # The scheme pip installs a `--prefix` with.
    preferred = getattr(sysconfig, "get_preferred_scheme", None)
    scheme = preferred("prefix") if preferred else "posix_prefix"
    paths = sysconfig.get_paths(scheme, vars={"base": prefix, "platbase": prefix})
    found = []
    for key in ("purelib", "platlib"):
        path = paths.get(key)
        if path and path not in found:
            found.append(path)
    try:
        for path in found:
            os.makedirs(path, exist_ok=True)
    except OSError:
        return
    at = next(
        (i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))),
        len(sys.path),
    )
    sys.path[at:at] = [p for p in found if p not in sys.path]
    os.environ["PIP_PREFIX"] = prefix
    # The user's cache is not writable here (pip would say so on every install).
    os.environ.setdefault("PIP_NO_CACHE_DIR", "1")
    scripts = paths.get("scripts")
    if scripts:
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


def main(fd, max_frame, shadow_fd, shadow_size, handover_fd=-1, announce_fd=-1):
    """Serves the host on descriptor `fd` until it says stop or goes away; `shadow_fd` is the
    memory file where unsent output waits, `handover_fd` the socket a branch's descriptors
    come on, `announce_fd` the pipe to this process's guard, when it has one (the host's
    `guard.rs`: where no control group holds the session)."""
    try:
        import mmap

        _Buffered.shadow = mmap.mmap(shadow_fd, shadow_size)
        _Buffered.shadow_size = shadow_size
        os.close(shadow_fd)
    except (ImportError, OSError, ValueError):
        _Buffered.shadow = None
    _State.fd = fd
    _State.max_frame = max_frame
    if announce_fd >= 0:
        # The guard, this process's parent, is the root of the tree and learns from here who
        # serves after a rollback and which processes lead branches.
        os.set_inheritable(announce_fd, False)
        _State.announce = (-1, announce_fd)
        _State.root = False
        _State.guard_fd = announce_fd
    else:
        _State.announce = os.pipe()
    _State.handover = handover_fd
    if handover_fd >= 0:
        os.set_inheritable(handover_fd, False)
    os.set_inheritable(fd, False)
    os.set_blocking(fd, False)
    _State.readable = select.poll()
    _State.readable.register(fd, select.POLLIN)
    _State.writable = select.poll()
    _State.writable.register(fd, select.POLLOUT)
    # The host reads the original stderr for a dying interpreter's last words.
    diagnostics = os.dup(2)
    os.set_inheritable(diagnostics, False)
    _State.diagnostics = diagnostics
    try:
        import faulthandler

        faulthandler.enable(file=os.fdopen(diagnostics, "w", closefd=False))
    except Exception:
        pass
    _capture_descriptors()
    _quiet_fork_warning()
    _use_packages()
    executor.install()
    executor.hide_frames_of(_KERNEL_FILE)
    executor.reset_namespace(_State.namespace)
    signal.signal(signal.SIGINT, _on_sigint)
    os.register_at_fork(after_in_child=_forked)
    _ready()
    _serve()
