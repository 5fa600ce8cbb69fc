//! Sessions on disk (cave-session, `cave_agent::session`): a namespace saved from one runtime
//! comes back in a fresh one, on the in-process runtime and
//! the kernel runtime (sandboxed, the default): plain values, a pandas DataFrame when pandas
//! is there, an instance of a class from a registered Python file, functions and classes the
//! cells defined and their instances, modules bound to names; what cannot be saved is named.
//! And a host killed with SIGKILL in the middle of saves leaves a session that loads.

use cave_agent::session::{Restored, Saved, Session, SessionError};
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, AgentExt, DiscardOutput, Function, InProcRuntime, KernelRuntime, Message, ObjectBinding,
    Resources, Runtime, Shared, Signature,
};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cave-session-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn run(runtime: &dyn Runtime, code: &str) -> String {
    let out = runtime.execute(code, &DiscardOutput).await.expect("runs");
    assert!(out.success(), "{code}: {}", out.output);
    out.output
}

/// A Python file the host registers, as `--py` does.
fn module(dir: &Path) -> PathBuf {
    let path = dir.join("shapes.py");
    std::fs::write(
        &path,
        "class Point:\n    \"\"\"A point.\"\"\"\n    def __init__(self, x: int, y: int):\n        self.x = x\n        self.y = y\n    def norm1(self) -> int:\n        return abs(self.x) + abs(self.y)\n",
    )
    .unwrap();
    path
}

fn has_pandas() -> bool {
    std::process::Command::new(
        std::env::var("CAVE_PYTHON").unwrap_or_else(|_| "python3".to_owned()),
    )
    .args(["-c", "import pandas"])
    .status()
    .is_ok_and(|s| s.success())
}

/// A host object: its class (`KvStore`) is bound beside it, the host's and not the model's.
#[cave_agent::object]
#[derive(Debug, Default)]
struct KvStore {
    /// How many values it holds.
    #[cave(get)]
    len: i64,
}

#[cave_agent::object]
impl KvStore {
    /// Stores one more value; the new count.
    pub fn put(&mut self) -> i64 {
        self.len += 1;
        self.len
    }
}

/// What the host registers at each start: an object, and a function whose Python source
/// defines a helper beside it.
fn host_resources(store: &std::sync::Arc<Shared<KvStore>>) -> Resources {
    Resources::new()
        .object(ObjectBinding::new("store", store.clone()))
        .function(Function::python(
            "tripled",
            Signature::default(),
            "def _times(n, k):\n    return n * k\ndef helper3(n):\n    return _times(n, 3)\ndef tripled(n):\n    return helper3(n)\n",
        ))
}

/// The round trip on `make`'s runtimes.
async fn round_trip(name: &str, make: impl Fn() -> Box<dyn Runtime>) {
    let dir = scratch(name);
    let py = module(&dir);
    let session = Session::open(dir.join("session"))
        .unwrap()
        .registration(serde_json::json!({"py": [py]}));
    let first = make();
    first.register_python_file(&py, false).await.unwrap();
    let store = Shared::new(KvStore::default());
    first.register(host_resources(&store)).await.unwrap();
    let pandas = has_pandas();
    run(
        &*first,
        "import json as j\nimport threading\ntotals = {'a': [1, 2.5, None], 'b': 'x'}\np = Point(3, -4)\n\
         def double(n):\n    return 2 * n\n\
         class Box:\n    def __init__(self, v):\n        self.v = v\n\
         class Crate(Box):\n    pass\n\
         boxed = Crate(double(21))\nlock = threading.Lock()\n_private = 1\n\
         twice = double\ninc = lambda n: n + 1\n",
    )
    .await;
    if pandas {
        run(
            &*first,
            "import pandas as pd\ndf = pd.DataFrame({'n': [1, 2, 3]})",
        )
        .await;
    }
    let history = vec![Message::user("build things"), Message::assistant("built")];
    let report = session.save(&history, &*first).await.expect("saves");
    let skipped: Vec<&str> = report.skipped.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(skipped, ["lock"], "{report:?}");
    assert!(report.skipped[0].1.contains("pickle"), "{report:?}");
    let saved: Vec<&str> = report.saved.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "Box",
        "Crate",
        "boxed",
        "double",
        "j",
        "p",
        "threading",
        "totals",
    ] {
        assert!(
            saved.contains(&expected),
            "{expected} not saved: {report:?}"
        );
    }
    for host in ["Point", "KvStore", "store", "tripled", "helper3"] {
        assert!(
            !saved.contains(&host),
            "the host's {host} was saved: {report:?}"
        );
    }
    assert!(!saved.contains(&"_private"));
    // Nothing of the save is left in the namespace.
    assert_eq!(
        run(&*first, "print('_cave_session_payload' in globals())").await,
        "False\n"
    );
    // A kernel runtime's child ends with it.
    drop(first);

    // A fresh runtime, the host's file registered again.
    let loaded = session.load().unwrap().expect("a saved session");
    assert_eq!(loaded.history, history);
    assert_eq!(loaded.registration["py"][0], py.to_str().unwrap());
    let second = make();
    second.register_python_file(&py, false).await.unwrap();
    second.register(host_resources(&store)).await.unwrap();
    let restored = second_restore(&session, &loaded, &*second).await;
    let line = restored.line();
    assert!(line.contains("not restored: lock ("), "{line}");
    assert!(
        !line.contains("KvStore") && !line.contains("helper3"),
        "only what the model's code made is reported: {line}"
    );
    assert_eq!(
        run(&*second, "print(store.put(), tripled(2))").await,
        "1 6\n"
    );
    for expected in ["boxed", "double", "j", "p", "totals", "Crate"] {
        assert!(
            restored.restored.iter().any(|n| n == expected),
            "{expected}: {line}"
        );
    }
    assert_eq!(
        run(
            &*second,
            "print(totals['a'], p.norm1(), isinstance(p, Point), double(4), boxed.v, isinstance(boxed, Box), j.dumps([1]), twice(5), inc(1))"
        )
        .await,
        "[1, 2.5, None] 7 True 8 42 True [1] 10 2\n"
    );
    if pandas {
        assert_eq!(
            run(&*second, "print(int(df['n'].sum()), type(df).__name__)").await,
            "6 DataFrame\n"
        );
    }
    // A restored session saves again: what was defined from saved sources is found again.
    let again = session.save(&history, &*second).await.expect("saves again");
    assert!(again.skipped.is_empty(), "{again:?}");
    let saved: Vec<&str> = again.saved.iter().map(|(n, _)| n.as_str()).collect();
    for expected in ["Box", "Crate", "double", "twice", "inc", "boxed", "p"] {
        assert!(
            saved.contains(&expected),
            "{expected} not saved again: {again:?}"
        );
    }
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn second_restore(session: &Session, loaded: &Saved, runtime: &dyn Runtime) -> Restored {
    session.restore(loaded, runtime).await.expect("restores")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_comes_back_in_process() {
    round_trip("inproc", || {
        Box::new(InProcRuntime::new().expect("the interpreter starts"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_comes_back_in_a_sandboxed_kernel() {
    round_trip("kernel", || {
        Box::new(KernelRuntime::new().expect("a Python interpreter"))
    })
    .await;
}

/// Values past the size limit are skipped and named; the rest is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_past_the_size_limit_are_named() {
    let dir = scratch("limit");
    let session = Session::open(&dir).unwrap().max_bytes(10_000);
    let runtime = KernelRuntime::new().unwrap();
    run(&runtime, "big = 'x' * 50_000\nsmall = 1").await;
    let report = session.save(&[], &runtime).await.unwrap();
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!(report.skipped[0].0, "big");
    assert!(
        report.skipped[0].1.contains("size limit of 10000 bytes"),
        "{report:?}"
    );
    let fresh = KernelRuntime::new().unwrap();
    let restored = session
        .restore(&session.load().unwrap().unwrap(), &fresh)
        .await
        .unwrap();
    assert_eq!(restored.restored, ["small"]);
    assert!(
        restored.line().contains("not restored: big ("),
        "{}",
        restored.line()
    );
    fresh.stop().await;
    runtime.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run in a separate host process (by `a_host_killed_mid_save_leaves_a_loadable_session`):
/// saves a growing namespace in a loop until killed, printing each generation saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_saving_until_killed() {
    let Some(dir) = std::env::var_os("CAVE_SESSION_TEST_HOST") else {
        return;
    };
    let session = Session::open(PathBuf::from(dir)).unwrap();
    let runtime = KernelRuntime::new().unwrap();
    for turn in 0.. {
        run(
            &runtime,
            &format!("turn = {turn}\nblob = bytes(range(256)) * 4096 * ({turn} % 7 + 1)"),
        )
        .await;
        let history = vec![Message::user(format!("turn {turn}"))];
        session.save(&history, &runtime).await.unwrap();
        println!("saved {turn}");
    }
}

#[test]
fn a_host_killed_mid_save_leaves_a_loadable_session() {
    let dir = scratch("killed");
    let mut host = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "host_saving_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CAVE_SESSION_TEST_HOST", &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(host.stdout.take().unwrap());
    // Killed at different points of a save: after a few saves, then mid-way through more.
    let mut seen = 0;
    for line in lines.lines().map_while(Result::ok) {
        if line.contains("saved ") {
            seen += 1;
            if seen == 5 {
                // A little into the next save.
                std::thread::sleep(Duration::from_millis(7));
                break;
            }
        }
    }
    host.kill().unwrap();
    host.wait().unwrap();
    assert!(seen >= 5, "the host did not save");
    let session = Session::open(&dir).unwrap();
    let loaded = session.load().expect("loads").expect("a saved session");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let runtime = KernelRuntime::new().unwrap();
        let restored = session.restore(&loaded, &runtime).await.unwrap();
        assert!(
            restored.restored.contains(&"turn".to_owned()),
            "{restored:?}"
        );
        let turn: i64 = run(&runtime, "print(turn)").await.trim().parse().unwrap();
        // The history and the namespace are of the same save.
        assert_eq!(loaded.history, vec![Message::user(format!("turn {turn}"))]);
        assert_eq!(
            run(&runtime, "print(len(blob) == 256 * 4096 * (turn % 7 + 1))").await,
            "True\n"
        );
        runtime.stop().await;
    });
    // Only one generation's files remain beside a crashed save's leftovers at most.
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory written by a newer cave-agent is refused with what to do.
#[test]
fn a_newer_session_is_refused() {
    let dir = scratch("newer");
    std::fs::write(
        dir.join("session.json"),
        r#"{"format_version": 2, "generation": 1, "history": "history-1.json"}"#,
    )
    .unwrap();
    let error = Session::open(&dir).unwrap().load().unwrap_err();
    assert!(matches!(error, SessionError::Newer { found: 2, .. }));
    assert!(error.to_string().contains("upgrade cave-agent"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A value holding a secret's text is not written to the session: it is named instead, and the
/// directory holds no trace of the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_holding_a_secret_are_not_saved() {
    const SECRET: &str = "sk-session-secret-0123456789";
    let dir = scratch("secret");
    let session = Session::open(&dir).unwrap();
    let runtime = KernelRuntime::new().unwrap();
    runtime
        .register(
            cave_agent::Resources::new().variable(cave_agent::Variable::secret("token", SECRET)),
        )
        .await
        .unwrap();
    run(&runtime, "copy = token\nholder = {'k': [token]}\nfine = 1").await;
    let report = session.save(&[], &runtime).await.unwrap();
    let skipped: Vec<&str> = report.skipped.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(skipped, ["copy", "holder"], "{report:?}");
    assert!(report.skipped[0].1.contains("secret"), "{report:?}");
    assert!(report.saved.iter().any(|(n, _)| n == "fine"));
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "the secret is on disk"
        );
    }
    runtime.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program's session as the CLI keeps one, in two calls: `resume` before the agent is built
/// (values restored, the conversation and the line saying what came back), `save_turn` after
/// each run; a run that lost the runtime's state keeps the values saved before. On the kernel
/// runtime: in-process runtimes of one process share the interpreter's line cache, where this
/// test's `<cell 1>` would replace the source of the in-process round trip's, run meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_resumes_and_saves_a_session_in_two_calls() {
    let dir = scratch("resume");
    let session = Session::open(&dir).unwrap();
    let block = |code: &str| Reply::text(format!("```python\n{code}\n```"));

    let model = ScriptedModel::new([block("total = 41"), Reply::text("Kept.")]);
    let runtime = KernelRuntime::new().unwrap();
    let mut builder = Agent::builder(model, runtime.clone());
    let nothing = session.resume(&mut builder, &runtime).await.unwrap();
    assert!(nothing.is_none(), "nothing was saved yet");
    let mut agent = builder.build().unwrap();
    let response = agent.run("Keep a total.").await;
    assert!(response.completed() && !response.state_lost, "{response}");
    assert_eq!(agent.ledger().cells, 1);
    session
        .save_turn(&agent, response.state_lost)
        .await
        .unwrap();
    let first_ledger = agent.ledger().clone();
    assert_eq!(session.load().unwrap().unwrap().ledger, first_ledger);

    // The next start: a fresh runtime, the same two calls.
    let model = ScriptedModel::new([block("print(total + 1)"), Reply::text("42.")]);
    let runtime = KernelRuntime::new().unwrap();
    let mut builder = Agent::builder(model, runtime.clone());
    let restored = session.resume(&mut builder, &runtime).await.unwrap();
    assert_eq!(restored.expect("a saved session").restored, ["total"]);
    let mut agent = builder.build().unwrap();
    let said = agent.history().last().unwrap().content().to_owned();
    assert!(
        said.starts_with("[session resumed] restored: total"),
        "{said}"
    );
    let response = agent.run("One more.").await;
    assert!(response.completed(), "{response}");
    // The ledger went on from the first process's.
    let ledger = agent.ledger();
    assert_eq!(ledger.cells, 2, "{ledger:?}");
    assert_eq!(ledger.model_calls, 4, "{ledger:?}");
    assert!(ledger.tokens.total_tokens > first_ledger.tokens.total_tokens);
    assert!(ledger.cell_seconds > first_ledger.cell_seconds);
    assert!(
        agent.history().iter().any(
            |m| matches!(m, Message::ExecutionResult { content, .. } if content.contains("42"))
        ),
        "the restored value was used: {:?}",
        agent.history()
    );

    // A run whose runtime lost its state: the emptied namespace replaces nothing.
    session.save_turn(&agent, true).await.unwrap();
    let loaded = session.load().unwrap().expect("saved");
    assert_eq!(loaded.history.len(), agent.history().len());
    assert_eq!(&loaded.ledger, agent.ledger());
    let fresh = KernelRuntime::new().unwrap();
    let restored = session.restore(&loaded, &fresh).await.unwrap();
    assert_eq!(
        restored.restored,
        ["total"],
        "the values saved before are kept"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
