//! The escape corpus: each attempt fails in the strict sandbox (and the failure is the
//! sandbox's), and the same cells succeed with the sandbox off where doing so is harmless to
//! the machine. Layers this machine lacks are reported unavailable, and their cases skip with
//! the reason printed.

use cave_runtime_kernel::{
    KernelConfig, KernelRuntime, LayerState, Limits, Need, Sandbox, sandbox_support,
};
use cave_testing::contract::run;
use std::io::Write;

/// Whether this process runs as root (its effective uid, from `/proc/self/status`).
fn effective_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    })
}

/// Whether `test` skips here for want of `need` (see `cave_testing::machine`).
fn skip(test: &str, need: Need) -> bool {
    cave_testing::machine::skips(test, need.lacking())
}

fn strict() -> KernelRuntime {
    KernelRuntime::with_config(
        KernelConfig::new()
            .spare(false)
            .sandbox(Sandbox::strict())
            .limits(Limits::default().processes(32).memory(512 << 20)),
    )
    .expect("python")
}

fn open() -> KernelRuntime {
    KernelRuntime::with_config(KernelConfig::new().spare(false).sandbox(Sandbox::off()))
        .expect("python")
}

/// A file outside any directory the sandbox allows.
struct Outside {
    dir: std::path::PathBuf,
}

impl Outside {
    fn new(tag: &str) -> Outside {
        let dir = std::env::temp_dir().join(format!("cave-escape-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut file = std::fs::File::create(dir.join("secret.txt")).unwrap();
        file.write_all(b"the host's secret").unwrap();
        Outside { dir }
    }
    fn secret(&self) -> String {
        self.dir.join("secret.txt").display().to_string()
    }
    fn target(&self) -> String {
        self.dir.join("written.txt").display().to_string()
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `code`, which prints one word: what happened.
async fn outcome(rt: &KernelRuntime, code: &str) -> String {
    let out = run(rt, code).await;
    assert!(
        out.error.is_none(),
        "the probe itself failed: {}",
        out.output
    );
    out.output.trim().to_owned()
}

const CONNECT: &str = "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', PORT), timeout=2)\n    s.close()\n    print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tcp_connection_to_the_host() {
    // Either layer refuses it: the namespace has no route to the host, seccomp no socket.
    let lacking = Need::Namespaces.lacking().and(Need::Seccomp.lacking());
    if cave_testing::machine::skips("no_tcp_connection_to_the_host", lacking) {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let code = CONNECT.replace("PORT", &port);
    let rt = strict();
    assert!(outcome(&rt, &code).await.starts_with("refused"));
    rt.stop().await;
    let rt = open();
    assert_eq!(outcome(&rt, &code).await, "connected");
    rt.stop().await;
}

const UNIX: &str = "import socket\ntry:\n    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n    s.settimeout(2)\n    s.connect(PATH)\n    print('answered', s.recv(16).decode())\nexcept OSError as e:\n    print('refused', type(e).__name__)";

/// A host process listening on a Unix-domain socket outside the work directory (as the Docker
/// daemon, D-Bus or an SSH agent do) is out of reach: Landlock does not govern `connect`, and
/// the network namespace does not separate sockets on the filesystem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_to_a_host_unix_socket() {
    if skip("no_connection_to_a_host_unix_socket", Need::Namespaces) {
        return;
    }
    let outside = Outside::new("unix");
    let path = outside.dir.join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = (&stream).write_all(b"hello");
        }
    });
    let code = UNIX.replace("PATH", &format!("{:?}", path.display().to_string()));
    let rt = strict();
    assert_eq!(outcome(&rt, &code).await, "refused PermissionError");
    // Python's own plumbing keeps working: socketpair, and asyncio on top of it.
    let plumbing = "import socket, asyncio\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1).decode(), asyncio.run(asyncio.sleep(0, 'ok')))";
    assert_eq!(outcome(&rt, plumbing).await, "x ok");
    rt.stop().await;
    let rt = open();
    assert_eq!(outcome(&rt, &code).await, "answered hello");
    rt.stop().await;
}

/// io_uring runs operations seccomp cannot see: refused, as in Docker's default profile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_io_uring() {
    if skip("no_io_uring", Need::Seccomp) {
        return;
    }
    let rt = strict();
    let code = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nparams = ctypes.create_string_buffer(120)\nr = libc.syscall(425, 4, params)\nprint('io_uring_setup', r, os.strerror(ctypes.get_errno()))";
    assert_eq!(
        outcome(&rt, code).await,
        "io_uring_setup -1 Operation not permitted"
    );
    rt.stop().await;
}

const READ: &str = "try:\n    print(open(PATH).read()[:3])\nexcept OSError as e:\n    print('denied', type(e).__name__)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reading_outside_the_work_directory() {
    if skip("no_reading_outside_the_work_directory", Need::Landlock) {
        return;
    }
    let outside = Outside::new("read");
    let code = READ.replace("PATH", &format!("{:?}", outside.secret()));
    let rt = strict();
    assert_eq!(outcome(&rt, &code).await, "denied PermissionError");
    let shadow = READ.replace("PATH", "'/etc/shadow'");
    assert_eq!(outcome(&rt, &shadow).await, "denied PermissionError");
    // The host's environment, through /proc, is out of reach too.
    let environ = READ.replace("PATH", "f'/proc/{__import__(\"os\").getppid()}/environ'");
    assert!(outcome(&rt, &environ).await.starts_with("denied"));
    // Its own directory works.
    let own = run(
        &rt,
        "open('notes.txt', 'w').write('mine')\nprint(open('notes.txt').read())",
    )
    .await;
    assert_eq!(own.output, "mine\n", "{}", own.output);
    rt.stop().await;
    let rt = open();
    assert_eq!(outcome(&rt, &code).await, "the");
    rt.stop().await;
}

const WRITE: &str = "try:\n    open(PATH, 'w').write('x')\n    print('written')\nexcept OSError as e:\n    print('denied', type(e).__name__)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_writing_outside_the_work_directory() {
    if skip("no_writing_outside_the_work_directory", Need::Landlock) {
        return;
    }
    let outside = Outside::new("write");
    let code = WRITE.replace("PATH", &format!("{:?}", outside.target()));
    let rt = strict();
    assert_eq!(outcome(&rt, &code).await, "denied PermissionError");
    assert!(!std::path::Path::new(&outside.target()).exists());
    rt.stop().await;
    let rt = open();
    assert_eq!(outcome(&rt, &code).await, "written");
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ptrace_no_mount() {
    if skip("no_ptrace_no_mount", Need::Seccomp) {
        return;
    }
    let rt = strict();
    let code = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.ptrace(16, os.getppid(), None, None)\nprint('ptrace', r, os.strerror(ctypes.get_errno()))\nr = libc.mount(b'none', b'.', b'tmpfs', 0, None)\nprint('mount', r, os.strerror(ctypes.get_errno()))";
    let out = run(&rt, code).await;
    assert_eq!(
        out.output, "ptrace -1 Operation not permitted\nmount -1 Operation not permitted\n",
        "{}",
        out.output
    );
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_raising_a_limit() {
    // As root, the user namespace (part of the network layer) is what takes the capability
    // to raise a hard limit away.
    if skip("no_raising_a_limit", Need::Namespaces) {
        return;
    }
    let rt = strict();
    let code = "import resource\nsoft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\ntry:\n    resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))\n    print('raised')\nexcept (ValueError, OSError) as e:\n    print('refused', type(e).__name__)";
    assert!(outcome(&rt, code).await.starts_with("refused"));
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_forking_past_the_process_limit() {
    // Without a control group the limit is RLIMIT_NPROC, which does not hold for root.
    if effective_root()
        && cave_testing::machine::skips(
            "no_forking_past_the_process_limit",
            Need::ControlGroups.lacking(),
        )
    {
        return;
    }
    let rt = strict();
    let code = "import os, time\nkids = []\ntry:\n    for _ in range(100):\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(5)\n            os._exit(0)\n        kids.append(pid)\n    print('forked', len(kids))\nexcept OSError as e:\n    print('stopped', type(e).__name__)\nfinally:\n    for pid in kids:\n        os.kill(pid, 9)\n        os.waitpid(pid, 0)";
    assert_eq!(outcome(&rt, code).await, "stopped BlockingIOError");
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_allocating_past_the_memory_limit() {
    let rt = strict();
    let out = run(&rt, "block = bytearray(2 << 30)\nprint('allocated')").await;
    let error = out.error.expect("the allocation fails");
    assert!(
        error.python_type == "MemoryError" || error.message.contains("out of memory"),
        "{error:?}"
    );
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_api_key_in_the_child() {
    let rt = strict();
    let code = "import os\nprint(sorted(k for k in os.environ if 'KEY' in k or 'TOKEN' in k))";
    assert_eq!(outcome(&rt, code).await, "[]");
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_is_reported() {
    let rt = strict();
    rt.start().await.expect("starts");
    let layers = rt.sandbox_layers().await.expect("started");
    let names: Vec<&str> = layers.iter().map(|l| l.name).collect();
    assert_eq!(names, ["network", "filesystem", "syscalls", "no_new_privs"]);
    for layer in &layers {
        eprintln!("{layer}");
        assert!(!matches!(layer.state, LayerState::Off), "{layer}");
    }
    // Python works as usual inside.
    let out = run(&rt, "import json, decimal, sqlite3\nprint(json.dumps({'a': decimal.Decimal('1.5').as_integer_ratio()}))").await;
    assert_eq!(out.output, "{\"a\": [3, 2]}\n", "{}", out.output);
    rt.stop().await;
    let rt = open();
    rt.start().await.expect("starts");
    assert!(
        rt.sandbox_layers()
            .await
            .expect("started")
            .iter()
            .all(|l| l.state == LayerState::Off)
    );
    rt.stop().await;
}

/// The agent says the layers once, at the start of the first run after the child started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reports_the_isolation_once() {
    use cave_core::{AgentBuilder, Event, Status};
    use cave_testing::{Reply, ScriptedModel};
    use futures_util::StreamExt;
    let rt = strict();
    rt.start().await.expect("starts");
    let model = ScriptedModel::new([Reply::text("One."), Reply::text("Two.")]);
    let mut agent = AgentBuilder::new(model, rt.clone())
        .build()
        .expect("builds");
    let isolation = |events: &[Event]| -> Vec<Vec<String>> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Status(Status::Isolation { layers }) => Some(layers.clone()),
                _ => None,
            })
            .collect()
    };
    let first: Vec<Event> = agent.stream("First.").collect().await;
    let said = isolation(&first);
    assert_eq!(said.len(), 1, "{first:?}");
    assert_eq!(said[0].len(), 4);
    assert!(said[0][0].starts_with("network: "), "{:?}", said[0]);
    let second: Vec<Event> = agent.stream("Second.").collect().await;
    assert!(isolation(&second).is_empty(), "said once");
    rt.stop().await;
}

/// Whether this machine gives a child a control group (the process and memory defaults need
/// one).
fn control_groups() -> bool {
    Need::ControlGroups.lacking().is_none()
}

/// What a program gets with nothing configured: every layer this machine supports, the
/// default limits, and a work directory of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defaults_are_the_strict_sandbox_and_its_limits() {
    let rt = KernelRuntime::new().expect("python");
    rt.start().await.expect("starts");
    let layers = rt.sandbox_layers().await.expect("started");
    for supported in sandbox_support() {
        let layer = layers
            .iter()
            .find(|l| l.name == supported.name)
            .unwrap_or_else(|| panic!("{} is reported", supported.name));
        match supported.state {
            LayerState::Active(_) => {
                assert!(matches!(layer.state, LayerState::Active(_)), "{layer}")
            }
            _ => assert!(matches!(layer.state, LayerState::Unavailable(_)), "{layer}"),
        }
    }
    let limits = rt.limits().await.expect("the child's limits");
    assert_eq!(limits, KernelConfig::new().limits_in_force());
    assert_eq!(limits.open_files, Some(1024));
    assert_eq!(limits.file_size, Some(4 << 30));
    if control_groups() {
        assert_eq!(limits.processes, Some(512));
        assert!(limits.memory.is_some_and(|m| m >= 1 << 30), "{limits}");
    }
    let cwd = run(&rt, "import os\nprint(os.getcwd())").await.output;
    let host = std::env::current_dir().unwrap();
    assert_ne!(
        cwd.trim(),
        host.to_str().unwrap(),
        "a work directory of its own"
    );
    let off = KernelRuntime::with_config(KernelConfig::new().sandbox(Sandbox::off())).unwrap();
    off.start().await.unwrap();
    assert_eq!(off.limits().await, Some(Limits::unsandboxed()));
}

/// A fork loop under the defaults is refused with an `OSError` the cell can catch, and the
/// session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_loop_is_refused_under_the_defaults() {
    if skip(
        "a_fork_loop_is_refused_under_the_defaults",
        Need::ControlGroups,
    ) {
        return;
    }
    let rt = KernelRuntime::new().expect("python");
    let out = run(
        &rt,
        "import os, time\n\
         children = []\n\
         try:\n    \
             while len(children) < 2000:\n        \
                 pid = os.fork()\n        \
                 if pid == 0:\n            \
                     time.sleep(60)\n            \
                     os._exit(0)\n        \
                 children.append(pid)\n    \
             print('not refused')\n\
         except OSError as error:\n    \
             print('refused:', type(error).__name__)\n\
         for pid in children:\n    \
             os.kill(pid, 9)\n    \
             os.waitpid(pid, 0)\n\
         print(len(children))",
    )
    .await;
    assert!(out.success(), "{out:?}");
    let mut lines = out.output.lines();
    assert_eq!(lines.next(), Some("refused: BlockingIOError"), "{out:?}");
    let made: u64 = lines.next().unwrap().parse().unwrap();
    assert!(made < 512, "{made} processes");
    assert_eq!(run(&rt, "1 + 1").await.output, "2\n");
}

/// A host that holds more descriptors than the child's open-files limit (a host with a few
/// hundred sessions) still starts sandboxed kernels, and the limit holds in them. (The child
/// holds the host's descriptors until `exec` closes them; set too early, the limit refused
/// the descriptors the sandbox's setup opens.)
#[tokio::test]
async fn a_host_holding_more_descriptors_than_the_limit_starts_sandboxed_kernels() {
    let limit = cave_runtime_kernel::DEFAULT_OPEN_FILES;
    let null = std::fs::File::open("/dev/null").unwrap();
    let held: Result<Vec<std::fs::File>, _> = (0..limit + 100).map(|_| null.try_clone()).collect();
    let Ok(held) = held else {
        eprintln!(
            "skipped: this process may not hold {} descriptors",
            limit + 100
        );
        return;
    };
    let rt = KernelRuntime::with_config(KernelConfig::new().spare(false)).unwrap();
    assert_eq!(run(&rt, "print('started')").await.output, "started\n");
    let limits = rt.limits().await.expect("the child's limits");
    assert_eq!(limits.open_files, Some(limit));
    drop(held);
}
