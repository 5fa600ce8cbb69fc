//! When the child starts, and that it never outlives what owns it.

use cave_core::RuntimeExt;
use cave_core::{DiscardOutput, Resources, Runtime, Value, Variable};
use cave_runtime_kernel::{KernelConfig, KernelRuntime};
use cave_testing::process::{alive, ends};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

async fn spare_of(rt: &KernelRuntime) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = rt.spare_pid() {
            return pid;
        }
        assert!(Instant::now() < deadline, "the spare never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_starts_until_code_needs_it() {
    let rt = KernelRuntime::new().expect("python");
    rt.register(Resources::new().variable(Variable::new("n", Value::Int(1))))
        .await
        .expect("registers");
    assert_eq!(
        rt.pid().await,
        None,
        "registering plain values starts nothing"
    );
    assert!(rt.describe().variables.contains("- name: n"));
    // Asking for a name that is not registered is answered without a process.
    let unknown = rt.retrieve("nope").await.expect_err("not registered");
    assert!(
        matches!(
            unknown,
            cave_core::RuntimeError::UnknownVariable { bound: false, .. }
        ),
        "{unknown}"
    );
    assert!(rt.is_bound("n").await.expect("asks") && !rt.is_bound("nope").await.expect("asks"));
    assert_eq!(rt.pid().await, None, "no process started to answer");
    rt.reset().await.expect("resets");
    assert_eq!(rt.pid().await, None);
    let out = rt.execute("n + 1", &DiscardOutput).await.expect("runs");
    assert_eq!(out.output, "2\n");
    assert!(rt.pid().await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spare_takes_over_after_a_crash_and_a_reset() {
    let rt = KernelRuntime::new().expect("python");
    rt.start().await.expect("starts");
    let first = rt.pid().await.expect("running");
    let spare = spare_of(&rt).await;
    rt.execute("import os\nos._exit(1)", &DiscardOutput)
        .await
        .expect("reports the death");
    rt.execute("1", &DiscardOutput).await.expect("runs");
    assert_eq!(rt.pid().await, Some(spare), "recovery used the spare");
    assert!(ends(first));
    let next_spare = spare_of(&rt).await;
    rt.reset().await.expect("resets");
    assert_eq!(rt.pid().await, Some(next_spare), "reset used the spare");
    assert!(ends(spare), "the replaced process is gone");
    let off = KernelRuntime::with_config(KernelConfig::new().spare(false)).expect("python");
    off.start().await.expect("starts");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(off.spare_pid(), None, "no spare when turned off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_drop_leave_no_process() {
    let rt = KernelRuntime::new().expect("python");
    rt.execute(
        "import subprocess\nchild = subprocess.Popen(['sleep', '60'])",
        &DiscardOutput,
    )
    .await
    .expect("runs");
    let main = rt.pid().await.expect("running");
    let grandchild: u32 = match rt.get("child").await {
        Err(_) => {
            let out = rt.execute("child.pid", &DiscardOutput).await.expect("runs");
            out.output.trim().parse().expect("a pid")
        }
        Ok(_) => unreachable!("a Popen is not a value"),
    };
    let spare = spare_of(&rt).await;
    rt.stop().await;
    rt.stop().await;
    assert!(
        ends(main) && ends(spare) && ends(grandchild),
        "stop ends the process group"
    );
    // A later request starts afresh.
    assert_eq!(
        rt.execute("2", &DiscardOutput).await.expect("runs").output,
        "2\n"
    );
    let again = rt.pid().await.expect("running");
    let spare = spare_of(&rt).await;
    drop(rt);
    assert!(ends(again) && ends(spare), "drop ends both processes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_leaves_no_process() {
    use cave_core::AgentBuilder;
    use cave_testing::{Reply, ScriptedModel};
    use futures_util::StreamExt;
    let rt = KernelRuntime::with_config(KernelConfig::new().spare(false)).expect("python");
    rt.start().await.expect("starts");
    let pid = rt.pid().await.expect("running");
    let model = ScriptedModel::new([Reply::text(
        "```python\nwhile True:\n    try:\n        import time; time.sleep(10)\n    except BaseException:\n        pass\n```",
    )]);
    let mut agent = AgentBuilder::new(model, rt.clone())
        .build()
        .expect("builds");
    {
        let mut stream = agent.stream("go");
        while let Some(event) = stream.next().await {
            if matches!(event, cave_core::Event::Code { .. }) {
                // Let the cell start, then drop the run.
                tokio::time::sleep(Duration::from_millis(300)).await;
                break;
            }
        }
    }
    drop(agent);
    drop(rt);
    assert!(
        ends(pid),
        "the cell ignored its interrupt, so its process was killed"
    );
}

/// Run in a separate host process (by `a_killed_host_leaves_no_process`): starts a runtime,
/// prints its processes' ids, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_held_for_the_kill_test() {
    if std::env::var_os("CAVE_KERNEL_TEST_HOST").is_none() {
        return;
    }
    let rt = KernelRuntime::new().expect("python");
    rt.start().await.expect("starts");
    let spare = spare_of(&rt).await;
    println!("pids {} {spare}", rt.pid().await.expect("running"));
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// Starts this test binary as a host process that runs only `test`, with `env` set; its
/// stdout is piped.
fn host_process(test: &str, env: &[(&str, &str)]) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the host starts")
}

#[test]
fn a_killed_host_leaves_no_process() {
    let mut host = host_process(
        "host_held_for_the_kill_test",
        &[("CAVE_KERNEL_TEST_HOST", "1")],
    );
    let stdout = host.stdout.take().expect("piped");
    // The harness prints the test's name on the same line.
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("pids ").map(|(_, pids)| pids.to_owned()))
        .expect("the host reports its children");
    let pids: Vec<u32> = line.split(' ').map(|p| p.parse().expect("a pid")).collect();
    assert!(pids.iter().all(|&p| alive(p)));
    host.kill().expect("SIGKILL");
    host.wait().expect("reaped");
    for pid in pids {
        assert!(ends(pid), "process {pid} outlived its host");
    }
}

#[test]
fn the_child_environment_holds_no_secrets() {
    if std::env::var_os("CAVE_KERNEL_TEST_ENV").is_some() {
        let rt = tokio::runtime::Runtime::new().expect("tokio");
        rt.block_on(async {
            let rt = KernelRuntime::new().expect("python");
            let out = rt
                .execute("import os\nprint(sorted(k for k in os.environ if k in ('LLM_API_KEY', 'SECRET_TOKEN', 'LANG', 'PATH')))", &DiscardOutput)
                .await
                .expect("runs");
            println!("child sees {}", out.output.trim());
        });
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "the_child_environment_holds_no_secrets",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CAVE_KERNEL_TEST_ENV", "1")
        .env("LLM_API_KEY", "sk-test-not-for-the-child")
        .env("SECRET_TOKEN", "also-not")
        .env("LANG", "C.UTF-8")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("child sees ['LANG', 'PATH']"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A cell that detaches a process the classic daemon way: fork, `setsid`, fork again, the
/// middle process exits; the grandchild runs `sleep MARK`, out of the worker's process group.
fn daemon_cell(mark: &str) -> String {
    format!(
        "import os\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', '{mark}'])\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('detached')"
    )
}

/// A mark no other process carries: a `sleep` duration unique to this test process and call.
fn mark(tag: u32) -> String {
    format!("3600.{}{tag:03}", std::process::id())
}

/// The live processes whose command line carries `mark`, counted through `/proc`.
fn marked(mark: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == mark.as_bytes()))
                && alive(pid)
        })
        .collect()
}

/// Waits (generously) for every process carrying `mark` to end.
fn all_end(mark: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = marked(mark);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The configurations the daemon tests run under: the sandbox off or strict, and the default
/// (strict) without a control group (the worker as a child subreaper is all that holds).
fn configured(mode: &str) -> KernelConfig {
    let config = KernelConfig::new().spare(false);
    match mode {
        "strict" => config.sandbox(cave_runtime_kernel::Sandbox::strict()),
        "off" => config.sandbox(cave_runtime_kernel::Sandbox::off()),
        "no control group" => config.control_group(false),
        other => panic!("no such mode: {other}"),
    }
}

async fn detach(rt: &KernelRuntime, mark: &str) {
    let out = rt
        .execute(&daemon_cell(mark), &DiscardOutput)
        .await
        .expect("runs");
    assert_eq!(out.output, "detached\n", "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while marked(mark).is_empty() {
        assert!(Instant::now() < deadline, "the daemon never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// After a rollback the serving process is a copy, and what its cells detach is adopted by the
/// first worker (the reaper), not by the copy: `stop` still ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_detached_after_a_rollback_ends_with_stop() {
    for (i, mode) in ["off", "no control group"].into_iter().enumerate() {
        let rt = KernelRuntime::with_config(configured(mode)).expect("python");
        rt.start().await.expect("starts");
        let checkpoint = rt.checkpoint().await.expect("a checkpoint");
        rt.rollback(&checkpoint).await.expect("rolls back");
        let detached = mark(90 + i as u32);
        detach(&rt, &detached).await;
        rt.stop().await;
        assert_eq!(all_end(&detached), Vec::<u32>::new(), "{mode}: after stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_daemon_ends_with_stop_reset_and_drop() {
    for (i, sandbox) in ["off", "strict", "no control group"]
        .into_iter()
        .enumerate()
    {
        let tag = 10 * i as u32;
        let rt = KernelRuntime::with_config(configured(sandbox)).expect("python");
        let stopped = mark(tag);
        detach(&rt, &stopped).await;
        rt.stop().await;
        assert_eq!(
            all_end(&stopped),
            Vec::<u32>::new(),
            "{sandbox}: after stop"
        );
        let reset = mark(tag + 1);
        detach(&rt, &reset).await;
        rt.reset().await.expect("resets");
        assert_eq!(all_end(&reset), Vec::<u32>::new(), "{sandbox}: after reset");
        let dropped = mark(tag + 2);
        detach(&rt, &dropped).await;
        drop(rt);
        assert_eq!(
            all_end(&dropped),
            Vec::<u32>::new(),
            "{sandbox}: after drop"
        );
    }
}

/// A worker that dies by itself (a crash, with the host alive) takes what its cells detached
/// with it, with a control group and without (where its guard ends them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_daemon_ends_when_its_worker_crashes() {
    for (i, mode) in ["strict", "no control group"].into_iter().enumerate() {
        let rt = KernelRuntime::with_config(configured(mode)).expect("python");
        let detached = mark(120 + i as u32);
        detach(&rt, &detached).await;
        let crashed = rt
            .execute("import ctypes\nctypes.string_at(0)", &DiscardOutput)
            .await
            .expect("runs");
        assert!(crashed.state_lost, "{mode}: {crashed:?}");
        assert_eq!(
            all_end(&detached),
            Vec::<u32>::new(),
            "{mode}: the daemon outlived its worker's crash"
        );
        let after = rt.execute("1 + 1", &DiscardOutput).await.expect("runs");
        assert_eq!(after.output, "2\n", "{mode}: {after:?}");
        rt.stop().await;
    }
}

/// Run in a separate host process (by `a_detached_daemon_ends_with_a_killed_host`): detaches
/// a daemon, says so, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_held_with_a_daemon() {
    let (Some(sandbox), Some(mark)) = (
        std::env::var_os("CAVE_KERNEL_TEST_SANDBOX"),
        std::env::var_os("CAVE_KERNEL_TEST_MARK"),
    ) else {
        return;
    };
    let rt =
        KernelRuntime::with_config(configured(sandbox.to_str().expect("utf-8"))).expect("python");
    detach(&rt, mark.to_str().expect("utf-8")).await;
    println!("daemon detached");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// The host killed by SIGKILL: its control group's keeper, or without one the worker's guard,
/// ends what the session detached.
#[test]
fn a_detached_daemon_ends_with_a_killed_host() {
    for (i, sandbox) in ["off", "strict", "no control group"]
        .into_iter()
        .enumerate()
    {
        let mark = mark(100 + i as u32);
        let mut host = host_process(
            "host_held_with_a_daemon",
            &[
                ("CAVE_KERNEL_TEST_SANDBOX", sandbox),
                ("CAVE_KERNEL_TEST_MARK", &mark),
            ],
        );
        let stdout = host.stdout.take().expect("piped");
        let said = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("daemon detached"));
        assert!(said, "{sandbox}: the host detached its daemon");
        assert_eq!(marked(&mark).len(), 1, "{sandbox}");
        host.kill().expect("SIGKILL");
        host.wait().expect("reaped");
        assert_eq!(
            all_end(&mark),
            Vec::<u32>::new(),
            "{sandbox}: the daemon outlived its host"
        );
    }
}

/// An interpreter the worker does not support hears why at start, in the error the host
/// returns: one older than the minimum, and a free-threaded build. Both are the machine's
/// own Python, made by a `sitecustomize` to report what such an interpreter reports (no
/// 3.13t can be installed here), so the check that runs is the worker's own; then a real
/// older Python when `CAVE_OLD_PYTHON` names one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_interpreter_is_refused_with_the_reason() {
    let (oldest_major, oldest_minor) = cave_python::MIN_PYTHON;
    for (name, pretend, expected) in [
        (
            "old",
            format!(
                "sys.version_info = ({oldest_major}, {}, 0, 'final', 0)",
                oldest_minor - 1
            ),
            format!(
                "is Python {oldest_major}.{}; the kernel runtime needs Python {oldest_major}.{oldest_minor} or later",
                oldest_minor - 1
            ),
        ),
        (
            "free-threaded",
            "sys.abiflags = 't'".to_owned(),
            cave_python::FREE_THREADED_REFUSAL.to_owned(),
        ),
    ] {
        let dir = std::env::temp_dir().join(format!("cave-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("sitecustomize.py"),
            format!("import sys\n{pretend}\n"),
        )
        .unwrap();
        // The work directory: the one place besides the interpreter's own the sandbox reads.
        let config = KernelConfig::new()
            .working_dir(&dir)
            .env("PYTHONPATH", dir.to_str().unwrap());
        let rt = KernelRuntime::with_config(config).unwrap();
        let error = rt.start().await.expect_err(name).to_string();
        assert!(error.contains(&expected), "{name}: {error}");
        rt.stop().await;
        std::fs::remove_dir_all(&dir).ok();
    }
    // A real older interpreter, where the machine has one (`cargo xtask test --pythons` sets
    // this for each it finds).
    if let Some(old) = std::env::var_os("CAVE_OLD_PYTHON") {
        let rt = KernelRuntime::with_config(KernelConfig::new().python(&old)).unwrap();
        let error = rt.start().await.expect_err("an older Python").to_string();
        assert!(
            error.contains(&format!(
                "; the kernel runtime needs Python {oldest_major}.{oldest_minor} or later"
            )),
            "{error}"
        );
        println!("refused: {error}");
    }
}

/// A worker that never says it is ready (here: an interpreter stuck before the worker runs,
/// as a Jupyter kernel that died while starting is) is killed after the start timeout, and one
/// fresh worker more is tried; when that one is stuck too, the start fails with the reason: a
/// start always ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_gets_ready_fails_the_start_in_time() {
    let dir = std::env::temp_dir().join(format!("cave-stuck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("pid");
    std::fs::write(
        dir.join("sitecustomize.py"),
        "import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(600)\n",
    )
    .unwrap();
    let config = KernelConfig::new()
        .working_dir(&dir)
        .env("PYTHONPATH", dir.to_str().unwrap())
        .spare(false)
        .start_timeout(Duration::from_secs(2));
    let rt = KernelRuntime::with_config(config).unwrap();
    let started = tokio::time::timeout(Duration::from_secs(60), rt.start())
        .await
        .expect("the start ends");
    let error = started.expect_err("a stuck worker").to_string();
    assert!(
        error.contains("did not start the worker within 2 s"),
        "{error}"
    );
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
    assert!(ends(pid), "the stuck process was left running");
    rt.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One stuck start (the first worker never gets ready) is followed by a fresh one, and the
/// runtime starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_never_got_ready_is_tried_once_more() {
    let dir = std::env::temp_dir().join(format!("cave-stuck-once-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("stuck"), "").unwrap();
    // Only the first interpreter finds the mark (and takes it away), then hangs.
    std::fs::write(
        dir.join("sitecustomize.py"),
        "import os, time\nif os.path.exists('stuck'):\n    os.remove('stuck')\n    time.sleep(600)\n",
    )
    .unwrap();
    let config = KernelConfig::new()
        .working_dir(&dir)
        .env("PYTHONPATH", dir.to_str().unwrap())
        .spare(false)
        .start_timeout(Duration::from_secs(2));
    let rt = KernelRuntime::with_config(config).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        rt.execute("print(6 * 7)", &DiscardOutput),
    )
    .await
    .expect("the start ends")
    .expect("the second worker starts");
    assert_eq!(out.output, "42\n");
    assert!(!dir.join("stuck").exists(), "the first worker never ran");
    rt.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether the runtime's worker loaded its own two modules precompiled (from the bytecode
/// cache): both, or neither (anything else fails the test).
async fn precompiled(config: KernelConfig) -> bool {
    match loaded(config).await {
        (true, true) => true,
        (false, false) => false,
        other => panic!("one module precompiled, the other not: {other:?}"),
    }
}

/// What `code` prints in a fresh runtime of `config` (stopped after).
async fn printed(config: KernelConfig, code: &str) -> String {
    let rt = KernelRuntime::with_config(config.spare(false)).expect("python");
    let out = rt.execute(code, &DiscardOutput).await.expect("runs");
    rt.stop().await;
    out.output
}

/// Whether the worker loaded its executor, then its kernel module, precompiled.
async fn loaded(config: KernelConfig) -> (bool, bool) {
    let out = printed(
        config,
        "import sys\nprint(sys.modules['cave_executor'].__cave_precompiled__, sys.modules['cave_kernel'].__cave_precompiled__)\nprint(1 + 1)",
    )
    .await;
    match out.as_str() {
        "True True\n2\n" => (true, true),
        "True False\n2\n" => (true, false),
        "False True\n2\n" => (false, true),
        "False False\n2\n" => (false, false),
        other => panic!("unexpected: {other:?}"),
    }
}

/// The only file in the cache directory `dir` (none left aside).
fn cache_file(dir: &std::path::Path) -> std::path::PathBuf {
    let files: Vec<_> = std::fs::read_dir(dir)
        .expect("the cache directory exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    match files.as_slice() {
        [file] if file.extension().is_some_and(|x| x == "bin") => file.clone(),
        _ => panic!("not one cache file in {dir:?}: {files:?}"),
    }
}

/// A copy of the cache `file` in a fresh cache directory under `root`, changed by `change`.
fn cache_copy(
    root: &std::path::Path,
    name: &str,
    file: &std::path::Path,
    change: impl FnOnce(&mut Vec<u8>),
) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join(name);
    std::fs::create_dir(&dir).expect("creates");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mut bytes = std::fs::read(file).expect("reads");
    change(&mut bytes);
    let copy = dir.join(file.file_name().expect("named"));
    std::fs::write(&copy, bytes).expect("writes");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    dir
}

/// The worker's own code is compiled once per interpreter and kept: a runtime with an empty
/// cache has the host compile it and fill the cache, the next takes it from memory, a runtime
/// of another directory holding that file reads it (and leaves it); a file cut short, damaged,
/// changed, or that others can write is not read but compiled afresh and replaced. Without a
/// cache, the worker compiles its sources. (What `read` refuses: `bytecode.rs`'s tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_code_is_kept_compiled_and_a_cache_in_doubt_is_replaced() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let root = cave_testing::TestDir::new("bytecode-cache");
    let cache = root.join("first");
    let config = |dir: &std::path::Path| KernelConfig::new().bytecode_cache(Some(dir.to_owned()));
    assert!(
        precompiled(config(&cache)).await,
        "compiled by the host at the first start"
    );
    let file = cache_file(&cache);
    let meta = |p: &std::path::Path| std::fs::metadata(p).expect("exists");
    assert_eq!(meta(&cache).mode() & 0o777, 0o700);
    assert_eq!(meta(&file).mode() & 0o777, 0o600);
    assert!(
        precompiled(config(&cache)).await,
        "taken from this process's memory"
    );
    let copied = cache_copy(&root, "copied", &file, |_| {});
    let before = meta(&cache_file(&copied)).ino();
    assert!(precompiled(config(&copied)).await, "read from disk");
    assert_eq!(
        meta(&cache_file(&copied)).ino(),
        before,
        "read, not replaced"
    );
    // The interpreter's magic number, which another version's bytecode would not have.
    let magic = {
        let out = printed(
            KernelConfig::new(),
            "import importlib.util\nprint(importlib.util.MAGIC_NUMBER.hex())",
        )
        .await;
        let hex = out.trim().to_owned();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect::<Vec<u8>>()
    };
    /// How a copy of the file is changed.
    type Change<'a> = Box<dyn FnOnce(&mut Vec<u8>) + 'a>;
    let changes: [(&str, Change); 4] = [
        ("cut", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() - 100))),
        (
            "garbage",
            Box::new(|b: &mut Vec<u8>| {
                let end = b.len();
                b[end - 1000..].fill(0x4e);
            }),
        ),
        (
            "other-magic",
            Box::new(|b: &mut Vec<u8>| {
                let at = b
                    .windows(magic.len())
                    .position(|w| w == magic.as_slice())
                    .expect("the magic is in the file");
                b[at] ^= 0x55;
            }),
        ),
        ("open-to-all", Box::new(|_: &mut Vec<u8>| {})),
    ];
    for (name, change) in changes {
        let dir = cache_copy(&root, name, &file, change);
        let doubtful = cache_file(&dir);
        if name == "open-to-all" {
            std::fs::set_permissions(&doubtful, std::fs::Permissions::from_mode(0o666))
                .expect("chmod");
        }
        let before = meta(&doubtful).ino();
        assert!(precompiled(config(&dir)).await, "{name}: compiled afresh");
        let replaced = cache_file(&dir);
        assert_ne!(meta(&replaced).ino(), before, "{name}: replaced");
        assert_eq!(meta(&replaced).mode() & 0o777, 0o600, "{name}");
    }
    assert!(
        !precompiled(KernelConfig::new().bytecode_cache(None)).await,
        "no cache: compiled at every start"
    );
}
