//! The kernel runtime over a real Jupyter Kernel Gateway started on 127.0.0.1: interrupts, a
//! kernel killed from outside, attaching to a kernel the runtime did not start. (The contract
//! suite runs in `jupyter_contract.rs`.)

#![cfg(feature = "jupyter")]

#[path = "support/on_gateway.rs"]
mod on_gateway;
#[path = "support/sessions.rs"]
mod sessions;
#[path = "support/gateway.rs"]
mod support;

use on_gateway::{config, runtime, runtime_on};

use cave_core::{Resources, Runtime, Value, Variable};
use cave_runtime_kernel::KernelRuntime;
use cave_testing::contract::run;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_stops_a_sleeping_cell() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt = runtime(gateway);
    cave_testing::contract::a_sleep_is_interrupted(&rt).await;
    rt.stop().await;
}

/// The kernel is killed behind the runtime's back: the next cell says state was lost, and runs
/// in a fresh kernel with what was registered bound again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_killed_from_outside_is_replaced() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt = runtime(gateway);
    sessions::a_killed_kernel_is_replaced(&rt).await;
    rt.stop().await;
}

/// Attached to a kernel someone else started: cells run in its namespace, and stopping or
/// dropping the runtime leaves the kernel running with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_kernel_is_left_running() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let id = start_kernel(gateway).await;
    let rt = runtime_on(config(gateway).attach(id.clone()));
    assert_eq!(run(&rt, "print(6 * 7)").await.output, "42\n");
    // Cells run in the kernel's own namespace.
    run(&rt, "left_by_the_agent = 'kept'").await;
    rt.stop().await;
    let status = kernel_api(gateway, reqwest::Method::GET, &format!("/{id}"))
        .send()
        .await
        .expect("the gateway answers")
        .status();
    assert!(status.is_success(), "{status}");
    // A runtime may attach to it again.
    let again = runtime_on(config(gateway).attach(id.clone()));
    assert_eq!(
        run(&again, "print(left_by_the_agent)").await.output,
        "kept\n"
    );
    // Dropped without a stop, while idle: let go gracefully, the namespace kept.
    drop(again);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let third = runtime_on(config(gateway).attach(id));
    assert_eq!(
        run(&third, "print(left_by_the_agent)").await.output,
        "kept\n"
    );
    third.stop().await;
}

/// A server that is not there, or a wrong token: a clear error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_or_url_is_a_clear_error() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt =
        runtime_on(cave_runtime_kernel::JupyterConfig::new(gateway.url.clone()).token("wrong"));
    let error = rt
        .execute("1", &cave_core::DiscardOutput)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("403") || error.to_string().contains("401"),
        "{error}"
    );
    assert!(error.to_string().contains("JUPYTER_TOKEN"), "{error}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let rt = runtime_on(cave_runtime_kernel::JupyterConfig::new(format!(
        "http://127.0.0.1:{port}"
    )));
    let error = rt
        .execute("1", &cave_core::DiscardOutput)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("could not reach"), "{error}");
}

/// `KERNEL_*` variables of the start request reach the kernel's environment (how Enterprise
/// Gateway is told a kernel's user, namespace or image).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_request_variables_reach_the_kernel() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt = runtime_on(config(gateway).env("KERNEL_USERNAME", "cave-test"));
    assert_eq!(
        run(&rt, "import os\nprint(os.environ.get('KERNEL_USERNAME'))")
            .await
            .output,
        "cave-test\n"
    );
    rt.stop().await;
}

/// A million ints in and out: frames far over a WebSocket message's size cross in chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_cross_in_chunks() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt = runtime(gateway);
    let numbers = Value::List((0..1_000_000).map(|i| Value::Int(i.into())).collect());
    rt.register(Resources::new().variable(Variable::new("numbers", numbers.clone())))
        .await
        .expect("registers");
    assert_eq!(
        run(&rt, "print(len(numbers), sum(numbers))").await.output,
        "1000000 499999500000\n"
    );
    run(&rt, "doubled = [2 * n for n in numbers]").await;
    let Value::List(doubled) = rt.get("doubled").await.expect("retrieved") else {
        panic!("a list")
    };
    assert_eq!(doubled.len(), 1_000_000);
    assert_eq!(doubled[999_999], Value::Int(1_999_998));
    // A long output crosses too, whole and in order.
    let out = run(&rt, "print('x' * 6_000_000)").await.output;
    assert_eq!(out.len(), 6_000_001);
    rt.stop().await;
}

/// A TCP proxy in front of the gateway that can cut every connection through it, or swallow
/// the next bytes sent one way and close that connection.
struct Proxy {
    url: String,
    accepting: tokio::task::AbortHandle,
    connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    /// Set to swallow the next bytes from a client (`.0`) or from the server (`.1`).
    swallow: std::sync::Arc<(AtomicBool, AtomicBool)>,
}

use std::sync::atomic::{AtomicBool, Ordering};

/// Copies `from` to `to` until either ends, or until `armed` is found set (then the bytes just
/// read are dropped, and the connection closes).
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    armed: &AtomicBool,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = from.read(&mut buffer).await.unwrap_or(0);
        if n == 0 || armed.swap(false, Ordering::SeqCst) {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    async fn start(gateway: &support::Gateway) -> Proxy {
        let target = gateway.url.trim_start_matches("http://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let connections = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let swallow = std::sync::Arc::new((AtomicBool::new(false), AtomicBool::new(false)));
        let (kept, armed) = (connections.clone(), swallow.clone());
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, armed) = (target.clone(), armed.clone());
                let task = tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    // Either way ending (or swallowing) closes both.
                    tokio::select! {
                        _ = relay(from_client, to_server, &armed.0) => {}
                        _ = relay(from_server, to_client, &armed.1) => {}
                    }
                });
                kept.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy {
            url,
            accepting: accepting.abort_handle(),
            connections,
            swallow,
        }
    }

    /// Cuts every connection and takes no more: the host can no longer reach the server.
    fn shut(&self) {
        self.accepting.abort();
        self.cut();
    }

    /// Drops the next bytes any client sends through it, and closes that connection.
    fn swallow_next_from_client(&self) {
        self.swallow.0.store(true, Ordering::SeqCst);
    }

    /// Drops the next bytes the server sends through it, and closes that connection.
    fn swallow_next_from_server(&self) {
        self.swallow.1.store(true, Ordering::SeqCst);
    }

    /// Drops every connection open through it (as a load balancer might).
    fn cut(&self) {
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

fn through(proxy: &Proxy, gateway: &support::Gateway) -> KernelRuntime {
    runtime_on(
        cave_runtime_kernel::JupyterConfig::new(proxy.url.clone()).token(gateway.token.clone()),
    )
}

/// Starts a kernel at the gateway through its REST API (as a notebook user would); its id.
async fn start_kernel(gateway: &support::Gateway) -> String {
    let kernel: serde_json::Value = kernel_api(gateway, reqwest::Method::POST, "")
        .json(&serde_json::json!({"name": "python3"}))
        .send()
        .await
        .expect("the gateway answers")
        .json()
        .await
        .expect("JSON");
    kernel["id"].as_str().expect("an id").to_owned()
}

/// A request to the gateway's `/api/kernels{path}`, with its token.
fn kernel_api(
    gateway: &support::Gateway,
    method: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(method, format!("{}/api/kernels{path}", gateway.url))
        .header("Authorization", format!("token {}", gateway.token))
}

/// A host that vanishes (its process dies, its network goes) leaves no busy kernel behind: the
/// worker stops waiting once the orphan timeout has passed with no answer, and the kernel goes
/// idle, for the server's idle culling, with its namespace. A live host's heartbeats keep an
/// idle session going past that timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_left_by_a_vanished_host_goes_idle() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let id = start_kernel(gateway).await;
    let state = || async {
        let kernel: serde_json::Value =
            kernel_api(gateway, reqwest::Method::GET, &format!("/{id}"))
                .send()
                .await
                .expect("the gateway answers")
                .json()
                .await
                .expect("JSON");
        kernel["execution_state"].as_str().unwrap_or("").to_owned()
    };
    let proxy = Proxy::start(gateway).await;
    let rt = runtime_on(
        cave_runtime_kernel::JupyterConfig::new(proxy.url.clone())
            .token(gateway.token.clone())
            .attach(id.clone())
            .orphan_timeout(Duration::from_secs(2)),
    );
    run(&rt, "x = 'kept'").await;
    // Idle for longer than the timeout, the session is kept alive by the runtime.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let out = run(&rt, "print(x)").await;
    assert!(
        out.output == "kept\n" && !out.state_lost,
        "the same worker serves: {out:?}"
    );
    assert_eq!(state().await, "busy", "the worker serves");

    proxy.shut();
    drop(rt);
    let begun = std::time::Instant::now();
    while state().await != "idle" {
        assert!(
            begun.elapsed() < Duration::from_secs(20),
            "the kernel is still busy long after its host vanished"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Its namespace is there for the next runtime.
    let again = runtime_on(config(gateway).attach(id.clone()));
    assert_eq!(run(&again, "print(x)").await.output, "kept\n");
    again.stop().await;
    let _ = kernel_api(gateway, reqwest::Method::DELETE, &format!("/{id}"))
        .send()
        .await;
}

/// Registers the host function `double(x)`; how many times it ran.
async fn register_double(rt: &KernelRuntime) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let double = cave_core::Function::host(
        "double",
        cave_core::Signature::new([cave_core::Param::new("x").annotated("int")]).returns("int"),
        move |args: cave_core::Args| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let x: i64 = args.get("x")?;
                Ok(Value::Int((x * 2).into()))
            }
        },
    );
    rt.register(Resources::new().function(double))
        .await
        .expect("registers");
    calls
}

/// A WebSocket lost between cells is opened again: the kernel and its namespace go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_websocket_is_reopened_once() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let (proxy, rt) = session_through_a_proxy(gateway).await;
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    next_cell_goes_on(&rt).await;
    rt.stop().await;
}

/// A runtime whose kernel ran `x = 41`, reached through a proxy the test controls.
async fn session_through_a_proxy(gateway: &support::Gateway) -> (Proxy, KernelRuntime) {
    let proxy = Proxy::start(gateway).await;
    let rt = through(&proxy, gateway);
    run(&rt, "x = 41").await;
    (proxy, rt)
}

/// After `x = 41`, the next cell runs in the same kernel, within 30 s.
async fn next_cell_goes_on(rt: &KernelRuntime) {
    let after = tokio::time::timeout(Duration::from_secs(30), run(rt, "print(x + 1)"))
        .await
        .expect("the cell ran");
    assert_eq!(after.output, "42\n", "{after:?}");
    assert!(!after.state_lost);
}

/// The socket lost with the host's answer in flight (the server never got it): the answer is
/// sent again on the reopened socket, so the kernel does not wait for it forever, and a copy
/// that did arrive is not taken twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_lost_with_the_websocket_is_sent_again() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let (proxy, rt) = session_through_a_proxy(gateway).await;
    // The next thing the host sends is the answer that carries this cell.
    proxy.swallow_next_from_client();
    next_cell_goes_on(&rt).await;
    // The session goes on, with answers and host frames in step.
    for i in 0..5 {
        let out = run(&rt, &format!("x += 1\nprint(x, {i})")).await;
        assert_eq!(out.output, format!("{} {i}\n", 42 + i), "{out:?}");
    }
    rt.stop().await;
}

/// The socket lost with the kernel's prompt in flight (a host call the host never got): the
/// last answer, sent again on the reopened socket, makes the worker ask again, and the call
/// goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_lost_with_the_websocket_is_asked_again() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let proxy = std::sync::Arc::new(Proxy::start(gateway).await);
    let rt = through(&proxy, gateway);
    let calls = register_double(&rt).await;
    run(&rt, "import time\nruns = 0").await;
    let arming = proxy.clone();
    let armer = tokio::spawn(async move {
        // Once the cell sleeps, the next thing the server sends is the call's prompt.
        tokio::time::sleep(Duration::from_millis(150)).await;
        arming.swallow_next_from_server();
    });
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        run(&rt, "runs += 1\ntime.sleep(0.6)\nprint(double(21), runs)"),
    )
    .await
    .expect("the cell ran: the worker asked again");
    armer.await.expect("joins");
    // Once: the answer sent again is not taken for the call's reply (it carries the cell).
    assert_eq!(out.output, "42 1\n", "{out:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the call ran once");
    for i in 0..3 {
        let out = run(&rt, &format!("print(double({i}))")).await;
        assert_eq!(out.output, format!("{}\n", 2 * i), "{out:?}");
    }
    rt.stop().await;
}

/// Lost twice while a cell runs: the execution fails and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_lost_twice_fails_the_execution() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let proxy = Proxy::start(gateway).await;
    let rt = through(&proxy, gateway);
    run(&rt, "import time").await;
    let cutter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(700)).await;
        proxy.cut();
        proxy
    });
    let failed = run(&rt, "time.sleep(3)\nprint('done')").await;
    let _proxy = cutter.await.expect("joins");
    assert!(failed.state_lost, "{failed:?}");
    assert!(failed.output.contains("lost again"), "{}", failed.output);
    rt.stop().await;
}

/// A host function may run a cell in the same kernel while the calling cell waits in its
/// host call: each cell's output stays its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_work_through_the_gateway() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let cell: std::sync::Arc<std::sync::OnceLock<KernelRuntime>> = Default::default();
    let inner = cell.clone();
    let evaluate = cave_core::Function::host(
        "evaluate",
        cave_core::Signature::new([cave_core::Param::new("code").annotated("str")]).returns("str"),
        move |args: cave_core::Args| {
            let inner = inner.clone();
            async move {
                let code: String = args.get("code")?;
                let rt = inner
                    .get()
                    .ok_or_else(|| cave_core::HostError::runtime("no runtime"))?;
                let out = rt
                    .execute(&code, &cave_core::DiscardOutput)
                    .await
                    .map_err(cave_core::HostError::runtime)?;
                Ok(Value::Str(out.output))
            }
        },
    );
    let rt = runtime(gateway);
    rt.register(Resources::new().function(evaluate))
        .await
        .expect("registers");
    let _ = cell.set(rt.clone());
    let out = run(
        &rt,
        "x = 20\nprint('outer before')\ninner = evaluate('print(\"inner\")\\nx + 1')\nprint('outer after', repr(inner))",
    )
    .await;
    assert_eq!(out.output, "outer before\nouter after 'inner\\n21\\n'\n");
    rt.stop().await;
}

/// A cell's own `input()` gets end of file, as in a child process (the stdin channel is the
/// runtime's), and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_in_a_cell_reads_end_of_file() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt = runtime(gateway);
    let asked = run(&rt, "input('Your name? ')").await;
    assert_eq!(asked.error.expect("raised").python_type, "EOFError");
    assert_eq!(run(&rt, "print('still here')").await.output, "still here\n");
    rt.stop().await;
}

/// A remote kernel has no local process id, and cannot be checkpointed or forked (the
/// refusal is typed and says which runtime can).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_kernel_has_no_pid_no_checkpoints_and_no_branches() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt = runtime(gateway);
    run(&rt, "x = 1").await;
    assert_eq!(rt.pid().await, None);
    let refused = rt.checkpoint().await.unwrap_err();
    assert!(
        refused.to_string().contains("cannot be copied"),
        "{refused}"
    );
    let refused = rt.fork().await.unwrap_err();
    assert!(
        matches!(&refused, cave_core::RuntimeError::NotSupported { operation: "fork", reason } if reason.contains("only a local child process can")),
        "{refused}"
    );
    assert_eq!(run(&rt, "print(x)").await.output, "1\n");
    rt.stop().await;
}

/// A worker that sends more than frames can hold (here a cell writing junk into the
/// transport itself) ends its link with a protocol violation; the host keeps nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_frames_ends_the_link() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let rt = KernelRuntime::jupyter(config(gateway).spare(false).max_frame(1 << 20));
    let flooded = run(
        &rt,
        "import sys\nk = sys.modules['cave_kernel']\nk._Jupyter.outbox += bytes(3_000_000)\nk._read_frame()",
    )
    .await;
    assert!(flooded.state_lost, "{flooded:?}");
    assert!(
        flooded.output.contains("protocol violation"),
        "{}",
        flooded.output
    );
    assert_eq!(run(&rt, "print('fresh')").await.output, "fresh\n");
    rt.stop().await;
}

/// A server that drops output past its IOPub rate limit (as Jupyter Server does by default, at
/// 1 MB/s): the cell's output says how much is missing, so the model knows it did not see it
/// all, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_dropped_by_a_rate_limit_is_said_in_the_cells_output() {
    let Some(gateway) = support::rate_limited_gateway() else {
        return;
    };
    let rt = runtime(gateway);
    // 1.2 MB in lines of 6000 characters: far past 100 kB in a second.
    let out = run(
        &rt,
        "for i in range(200):\n    print(str(i % 10) * 5999)\nx = 1",
    )
    .await;
    assert!(out.error.is_none() && !out.state_lost, "{out:?}");
    assert!(
        out.output.len() < 1_200_000,
        "the limit dropped output: {} characters arrived",
        out.output.len()
    );
    let note = out
        .output
        .lines()
        .find(|l| l.contains("did not arrive from the Jupyter server"))
        .unwrap_or_else(|| {
            panic!(
                "no note in the output's last lines: {:?}",
                &out.output[out.output.len().saturating_sub(600)..]
            )
        });
    let missing: usize = note
        .trim_start_matches('[')
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count of characters: {note}"));
    // The server's own notice is where the output broke off.
    let notice = out
        .output
        .find("IOPub data rate exceeded")
        .expect("the server's notice in the output");
    assert!(
        notice < out.output.len() - note.len() - 2,
        "before the note"
    );
    let notice_len = out.output[notice..]
        .find("(secs)\n\n")
        .map(|end| end + "(secs)\n\n".len())
        .expect("the whole notice");
    let delivered = out.output.len() - note.len() - 2 - notice_len;
    assert_eq!(
        delivered + missing,
        200 * 6000,
        "what arrived and what is said missing make up what was printed"
    );
    // The session goes on, and a small cell is whole once the window has passed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let next = run(&rt, "print(x + 1)").await;
    assert_eq!(next.output, "2\n", "{next:?}");
    rt.stop().await;
}

/// A cell that stopped at its interrupt, whose end the bridge holds while it waits for output
/// the server dropped (its rate limit), is not taken for a cell still running: past the
/// interrupt grace it is given time to arrive, not killed with its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_cell_whose_end_waits_for_output_is_not_killed() {
    let Some(gateway) = support::rate_limited_gateway() else {
        return;
    };
    // Shorter than the bridge's wait for output (5 s): its end is still held at the grace.
    let rt = runtime_on(config(gateway).interrupt_grace(Duration::from_secs(4)));
    run(&rt, "n = 0").await;
    let interrupter = rt.interrupter().expect("the runtime can interrupt");
    let stopper = tokio::spawn(async move {
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let interruption = interrupter.interrupt();
            if interruption != cave_core::Interruption::Idle {
                return interruption;
            }
        }
        cave_core::Interruption::Idle
    });
    // Past the server's limit, then busy: the interrupt lands in the loop.
    let out = run(
        &rt,
        "for i in range(200):\n    print(str(i % 10) * 5999)\nwhile True:\n    n += 1",
    )
    .await;
    assert_eq!(
        stopper.await.expect("the stopper ran"),
        cave_core::Interruption::Delivered
    );
    assert_eq!(
        out.error.as_ref().map(|e| e.python_type.as_str()),
        Some("KeyboardInterrupt"),
        "{:?}",
        out.error
    );
    assert!(!out.state_lost, "the cell was killed after it had stopped");
    assert_eq!(run(&rt, "n > 0").await.output, "True\n");
    rt.stop().await;
}

/// A server whose certificate a private CA signed, reached over `https://` and `wss://`: refused
/// (saying why) until the runtime is given the CA, then a working session with host calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_private_ca_is_reached_over_tls_once_the_ca_is_given() {
    if support::gateway().is_none() {
        return;
    }
    // A CA, and a certificate it signs for 127.0.0.1.
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "cave test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().expect("a key"))
        .expect("a CA certificate");
    let key = rcgen::KeyPair::generate().expect("a key");
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("server parameters")
        .signed_by(&key, &ca)
        .expect("a server certificate");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tls-gateway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let (cert_file, key_file) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_file, server.pem()).expect("written");
    std::fs::write(&key_file, key.serialize_pem()).expect("written");
    let gateway = support::start_with(
        "https",
        &[
            &format!("--KernelGatewayApp.certfile={}", cert_file.display()),
            &format!("--KernelGatewayApp.keyfile={}", key_file.display()),
            "--ZMQChannelsWebsocketConnection.limit_rate=False",
        ],
    )
    .expect("a gateway");
    assert!(gateway.url.starts_with("https://"), "{}", gateway.url);

    // The platform's store does not know the CA: a clear refusal, no kernel.
    let untrusted = runtime_on(config(&gateway));
    let refused = untrusted
        .start()
        .await
        .expect_err("an unknown CA is refused");
    let message = refused.to_string();
    assert!(
        message.contains("could not reach") && message.contains(&gateway.url),
        "{message}"
    );
    assert!(
        message.contains("invalid peer certificate") && message.contains("--jupyter-ca"),
        "says it is the certificate, and what to do: {message}"
    );

    // Given the CA: REST over https, channels over wss, a host call across them.
    let rt = runtime_on(config(&gateway).ca_certificates(ca.pem()));
    register_double(&rt).await;
    let out = run(&rt, "print(double(21))").await;
    assert_eq!(out.output, "42\n", "{out:?}");
    rt.stop().await;
}

/// What a Jupyter runtime gets with nothing set: a spare kernel, 5 s for an interrupt (it
/// crosses the server), the child's frame and output limits; a grace that is set is kept.
#[test]
fn a_jupyter_runtime_has_its_own_defaults() {
    let config = cave_runtime_kernel::JupyterConfig::new("http://127.0.0.1:9");
    let defaults = cave_runtime_kernel::WorkerSettings::default();
    assert_eq!(config.worker().interrupt_grace, Duration::from_secs(5));
    assert_eq!(
        (config.worker().spare, config.worker().cell),
        (defaults.spare, defaults.cell),
        "the same defaults as a child's, the grace aside"
    );
    let shown = format!("{config:?}");
    for field in [
        "spare: true",
        "stop_grace: 1s",
        &format!("max_frame: {}", cave_runtime_kernel::DEFAULT_MAX_FRAME),
        &format!("max_output: {}", cave_core::DEFAULT_MAX_HELD_OUTPUT),
    ] {
        assert!(shown.contains(field), "{field} in {shown}");
    }
    let set = config.interrupt_grace(Duration::from_secs(1));
    assert_eq!(set.worker().interrupt_grace, Duration::from_secs(1));
    // Nothing starts until the first request.
    let rt = KernelRuntime::jupyter(set);
    assert_eq!(
        rt.python(),
        None,
        "the server's interpreter, not one the host picks"
    );
}

/// A pool of Jupyter kernels cannot run setup code in a template (a remote kernel cannot be
/// forked): refused when the pool is made, saying what to do instead.
#[test]
fn a_jupyter_pool_with_setup_code_is_refused() {
    let config = cave_runtime_kernel::JupyterConfig::new("http://127.0.0.1:9");
    let refused = cave_runtime_kernel::KernelPool::jupyter(
        config,
        cave_runtime_kernel::PoolConfig::new(1).setup("import json"),
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("cannot be copied"), "{refused}");
}
