//! Branches of a live session (`KernelRuntime::fork`): independent runtimes whose processes
//! are copies of the running one.

use cave_core::{
    Args, DiscardOutput, Execution, HostError, HostObject, Method, ObjectBinding, Param, Resources,
    Runtime, RuntimeError, RuntimeExt, Signature, Value, Variable,
};
use cave_runtime_kernel::{KernelConfig, KernelRuntime, Limits, Need, Sandbox};
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

async fn run(rt: &KernelRuntime, code: &str) -> Execution {
    rt.execute(code, &DiscardOutput)
        .await
        .expect("the runtime works")
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.rsplit(") ").next().unwrap_or("").starts_with('Z'))
}

/// Waits (generously) for `pid` to end.
fn ends(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A counter held by the host: every branch's calls reach this one object.
#[derive(Default)]
struct Counter {
    count: Mutex<i64>,
}

#[async_trait::async_trait]
impl HostObject for Counter {
    fn type_name(&self) -> &str {
        "Counter"
    }
    fn methods(&self) -> Vec<Method> {
        vec![Method::new(
            "add",
            Signature::new([Param::new("n").annotated("int")]).returns("int"),
        )]
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        match method {
            "add" => {
                let n: i64 = args.get("n")?;
                let mut count = self.count.lock().map_err(HostError::runtime)?;
                *count += n;
                Ok(Value::Int((*count).into()))
            }
            other => Err(HostError::new("AttributeError", other.to_owned())),
        }
    }
}

fn config() -> KernelConfig {
    KernelConfig::new().spare(false)
}

/// A change in one branch is unseen in the other, both ways; imports and values made before
/// the fork are in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_diverge() {
    let parent = KernelRuntime::with_config(config()).expect("python");
    run(&parent, "import json\nx = [1, 2]").await;
    let branch = parent.fork().await.expect("forks");
    assert_ne!(branch.pid().await, parent.pid().await);
    run(&branch, "x.append(3)\ny = 'branch'").await;
    run(&parent, "x.append(4)\nz = 'parent'").await;
    assert_eq!(
        run(&branch, "print(json.dumps(x), 'z' in dir())")
            .await
            .output,
        "[1, 2, 3] False\n"
    );
    assert_eq!(
        run(&parent, "print(json.dumps(x), 'y' in dir())")
            .await
            .output,
        "[1, 2, 4] False\n"
    );
}

/// Host functions and objects work from every branch, and an object is the same one in each:
/// calls from both reach it, and the branch retrieves the very `Arc` the host registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_objects_are_the_same_object_in_every_branch() {
    let counter = Arc::new(Counter::default());
    let parent = KernelRuntime::with_config(config())
        .expect("python")
        .registered(
            Resources::new()
                .object(ObjectBinding::new("counter", counter.clone()))
                .variable(Variable::new("limit", Value::Int(10))),
        )
        .await
        .expect("registers");
    assert_eq!(run(&parent, "print(counter.add(1))").await.output, "1\n");
    let branch = parent.fork().await.expect("forks");
    assert_eq!(run(&branch, "print(counter.add(2))").await.output, "3\n");
    assert_eq!(run(&parent, "print(counter.add(3))").await.output, "6\n");
    let back: Arc<Counter> = branch.retrieve_object("counter").await.expect("bound");
    assert!(Arc::ptr_eq(&back, &counter), "the very object");
    // A variable is copied: each branch's change is its own.
    run(&branch, "limit = 20").await;
    assert_eq!(parent.get("limit").await.expect("reads"), Value::Int(10));
    assert_eq!(branch.get("limit").await.expect("reads"), Value::Int(20));
    // After a crash the branch starts fresh, with the copied registration bound again.
    let out = run(&branch, "import os\nos._exit(3)").await;
    assert!(out.state_lost, "{out:?}");
    assert_eq!(
        run(&branch, "print(counter.add(4), limit)").await.output,
        "10 10\n"
    );
    assert_eq!(*counter.count.lock().unwrap(), 10);
}

/// A fork of a fork works; a crash of one branch touches no other; ending the parent ends no
/// branch: with a control group per branch, and without (under the parent session's guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_live_on_their_own() {
    for config in [config(), config().control_group(false)] {
        let parent = KernelRuntime::with_config(config.clone()).expect("python");
        run(&parent, "depth = 0").await;
        let child = parent.fork().await.expect("forks");
        run(&child, "depth += 1").await;
        let grandchild = child.fork().await.expect("a fork of a fork");
        run(&grandchild, "depth += 1").await;
        assert_eq!(run(&grandchild, "print(depth)").await.output, "2\n");
        let crashed = run(&child, "import os\nos._exit(1)").await;
        assert!(crashed.state_lost, "{crashed:?}");
        assert_eq!(run(&grandchild, "print(depth)").await.output, "2\n");
        assert_eq!(run(&parent, "print(depth)").await.output, "0\n");
        let pids = [
            parent.pid().await.expect("running"),
            grandchild.pid().await.expect("running"),
        ];
        parent.stop().await;
        drop(parent);
        assert!(ends(pids[0]), "the parent's process ended");
        assert!(alive(pids[1]), "the grandchild lives on");
        assert_eq!(run(&grandchild, "print(depth)").await.output, "2\n");
        grandchild.stop().await;
        assert!(ends(pids[1]));
    }
}

/// Checkpoints and rollbacks work in a branch, and the parent's checkpoints are not the
/// branch's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollbacks_work_in_a_branch() {
    let parent = KernelRuntime::with_config(config()).expect("python");
    run(&parent, "x = 1").await;
    let before = parent.checkpoint().await.expect("checkpoints");
    let branch = parent.fork().await.expect("forks");
    assert!(
        branch.rollback(&before).await.is_err(),
        "a parent's checkpoint is not the branch's"
    );
    let mark = branch
        .checkpoint()
        .await
        .expect("checkpoints in the branch");
    run(&branch, "x = 2").await;
    branch.rollback(&mark).await.expect("rolls back");
    assert_eq!(run(&branch, "print(x)").await.output, "1\n");
    run(&parent, "x = 3").await;
    parent.rollback(&before).await.expect("rolls back");
    assert_eq!(run(&parent, "print(x)").await.output, "1\n");
    assert_eq!(run(&branch, "print(x)").await.output, "1\n");
}

/// Under the strict sandbox a branch works in a copy of the runtime's work directory: the
/// files written before the fork are in both, a change in one is unseen in the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_works_in_a_copy_of_the_work_directory() {
    let parent = KernelRuntime::with_config(config().sandbox(Sandbox::strict())).expect("python");
    run(&parent, "open('notes.txt', 'w').write('before')\nimport os\nos.mkdir('sub')\n_ = open('sub/a', 'w').write('a')").await;
    let branch = parent.fork().await.expect("forks");
    let out = run(&branch, "import os\nprint(open('notes.txt').read(), open('sub/a').read(), sorted(os.listdir('.')))\n_ = open('notes.txt', 'w').write('branch')").await;
    assert_eq!(out.output, "before a ['notes.txt', 'sub']\n", "{out:?}");
    assert_eq!(
        run(&parent, "print(open('notes.txt').read())").await.output,
        "before\n"
    );
    run(&parent, "open('notes.txt', 'w').write('parent')").await;
    assert_eq!(
        run(&branch, "print(open('notes.txt').read())").await.output,
        "branch\n"
    );
    // The sandbox holds in the branch: nothing outside its directories can be written.
    let out = run(&branch, "open('/tmp/cave-branch-escape', 'w')").await;
    assert!(out.output.contains("PermissionError"), "{out:?}");
    let dir = run(&branch, "import os\nprint(os.getcwd())").await.output;
    drop(branch);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(dir.trim()).exists() {
        assert!(
            Instant::now() < deadline,
            "the branch's directory is removed with it"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each branch is held under the limits of its parent, in a control group of its own: one
/// over its memory limit is killed alone, and a fork bomb in one stops at its process limit
/// while the others answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_over_its_limits_is_stopped_alone() {
    let limits = Limits::default().memory(256 << 20).processes(32);
    let parent = KernelRuntime::with_config(config().limits(limits)).expect("python");
    run(&parent, "kept = 7").await;
    let branch = parent.fork().await.expect("forks");
    let enforcement = branch.enforcement().await;
    if cave_testing::machine::skips(
        "a_branch_over_its_limits_is_stopped_alone",
        Need::ControlGroups.lacking(),
    ) {
        return;
    }
    assert!(
        enforcement.iter().any(|e| e.contains("control group")),
        "{enforcement:?}"
    );
    let out = run(
        &branch,
        "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024**2))",
    )
    .await;
    assert!(out.state_lost, "{out:?}");
    assert!(
        out.error
            .as_ref()
            .is_some_and(|e| e.message.contains("out of memory")),
        "{out:?}"
    );
    assert_eq!(run(&parent, "print(kept)").await.output, "7\n");
    let bomb = parent.fork().await.expect("forks");
    let out = run(&bomb, "import os\nwhile True:\n    os.fork()").await;
    assert!(!out.success(), "{out:?}");
    assert_eq!(run(&parent, "print(kept)").await.output, "7\n");
    drop(bomb);
}

/// Run in a separate host process (by `a_killed_host_ends_every_branch`): forks two branches,
/// prints every process's id, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_held_with_branches() {
    if std::env::var_os("CAVE_KERNEL_TEST_BRANCHES").is_none() {
        return;
    }
    let config = match std::env::var("CAVE_KERNEL_TEST_BRANCHES").as_deref() {
        Ok("no control group") => config().control_group(false),
        _ => config(),
    };
    let parent = KernelRuntime::with_config(config).expect("python");
    parent.start().await.expect("starts");
    let first = parent.fork().await.expect("forks");
    let second = first.fork().await.expect("forks");
    let mut pids = Vec::new();
    for rt in [&parent, &first, &second] {
        pids.push(rt.pid().await.expect("running").to_string());
    }
    println!("pids {}", pids.join(" "));
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// The host killed by SIGKILL: every branch ends, with control groups and without.
#[test]
fn a_killed_host_ends_every_branch() {
    for mode in ["control groups", "no control group"] {
        let mut host =
            std::process::Command::new(std::env::current_exe().expect("this test binary"))
                .args([
                    "--exact",
                    "host_held_with_branches",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("CAVE_KERNEL_TEST_BRANCHES", mode)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("the host starts");
        let stdout = host.stdout.take().expect("piped");
        let line = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.split_once("pids ").map(|(_, pids)| pids.to_owned()))
            .expect("the host reports its processes");
        let pids: Vec<u32> = line.split(' ').map(|p| p.parse().expect("a pid")).collect();
        assert_eq!(pids.len(), 3);
        assert!(pids.iter().all(|&p| alive(p)));
        host.kill().expect("SIGKILL");
        host.wait().expect("reaped");
        for pid in pids {
            assert!(ends(pid), "{mode}: process {pid} outlived its host");
        }
    }
}

/// Forking needs a process to copy: a cell running is refused; the in-process runtime does
/// not fork at all and says which runtime does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_during_a_cell_is_refused() {
    let parent = KernelRuntime::with_config(config()).expect("python");
    parent.start().await.expect("starts");
    let running = parent.clone();
    let cell = tokio::spawn(async move { run(&running, "import time\ntime.sleep(1)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = parent.fork().await;
    assert!(
        matches!(&refused, Err(RuntimeError::Backend { message, .. }) if message.contains("a cell is running")),
        "{refused:?}"
    );
    cell.await.expect("the cell ends");
    let branches = parent.fork_n(3).await;
    assert_eq!(branches.len(), 3);
    for branch in &branches {
        let branch = branch.as_ref().expect("forks");
        assert_eq!(run(branch, "print(1 + 1)").await.output, "2\n");
    }
}

/// A runtime taken from a pool forks too: under the strict sandbox its branch works in a copy
/// of the worker's own directory, and a branch of that branch in a copy of its.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_runtime_forks_in_the_sandbox() {
    let pool = cave_runtime_kernel::KernelPool::new(
        config().sandbox(Sandbox::strict()),
        cave_runtime_kernel::PoolConfig::new(1),
    )
    .expect("python");
    pool.filled(1).await.expect("fills");
    let parent = KernelRuntime::from_pool(&pool);
    run(&parent, "_ = open('level', 'w').write('0')").await;
    let child = parent.fork().await.expect("forks");
    run(&child, "_ = open('level', 'w').write('1')").await;
    let grandchild = child.fork().await.expect("forks again");
    run(&grandchild, "_ = open('level', 'w').write('2')").await;
    for (rt, level) in [(&parent, "0"), (&child, "1"), (&grandchild, "2")] {
        assert_eq!(
            run(rt, "print(open('level').read())").await.output,
            format!("{level}\n")
        );
    }
    drop(parent);
    drop(child);
    assert_eq!(
        run(&grandchild, "print(open('level').read())").await.output,
        "2\n"
    );
}

/// Model output is hostile: a cell that puts a link where the branches' directories go, or
/// links to a file outside, gets the host to make, copy or read nothing outside the work
/// directory; the fork refuses, or the link is copied as a link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_a_cell_leaves_take_the_host_nowhere() {
    let outside = std::env::temp_dir().join(format!("cave-fork-outside-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "hunter2").unwrap();
    let parent = KernelRuntime::with_config(config().sandbox(Sandbox::strict())).expect("python");
    let out = run(
        &parent,
        &format!(
            "import os\nos.symlink({:?}, 'secret-link')\nos.symlink({:?}, '.cave-branches')",
            outside.join("secret.txt").display().to_string(),
            outside.display().to_string()
        ),
    )
    .await;
    assert!(out.success(), "{out:?}");
    let refused = parent.fork().await;
    assert!(refused.is_err(), "a fork through the link");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "the host made nothing outside"
    );
    run(&parent, "os.remove('.cave-branches')").await;
    let branch = parent.fork().await.expect("forks");
    let out = run(
        &branch,
        "print(os.path.islink('secret-link'))\ntry:\n    open('secret-link').read()\nexcept OSError as e:\n    print(type(e).__name__)",
    )
    .await;
    assert_eq!(out.output, "True\nPermissionError\n", "{out:?}");
    drop(branch);
    let _ = std::fs::remove_dir_all(&outside);
}
