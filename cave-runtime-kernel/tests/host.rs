//! Host functions and objects called from the child, values both ways, Python files.

use cave_core::{
    Args, DiscardOutput, Execution, Function, HostError, HostObject, Method, ObjectBinding, Param,
    Resources, Runtime, RuntimeError, RuntimeExt, Signature, Value, Variable,
};
use cave_runtime_kernel::{KernelConfig, KernelRuntime};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::mpsc;

async fn run(rt: &KernelRuntime, code: &str) -> Execution {
    rt.execute(code, &DiscardOutput)
        .await
        .expect("the runtime works")
}

/// An object that cannot be serialized: it holds a channel's sending end.
struct Outbox {
    sender: mpsc::UnboundedSender<String>,
    sent: Mutex<u32>,
}

#[async_trait::async_trait]
impl HostObject for Outbox {
    fn type_name(&self) -> &str {
        "Outbox"
    }
    fn methods(&self) -> Vec<Method> {
        vec![Method::new(
            "send",
            Signature::new([Param::new("message").annotated("str")]).returns("int"),
        )]
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        match method {
            "send" => {
                let message: String = args.get("message")?;
                self.sender.send(message).map_err(HostError::runtime)?;
                let mut sent = self.sent.lock().map_err(HostError::runtime)?;
                *sent += 1;
                Ok(Value::Int((*sent).into()))
            }
            other => Err(HostError::new("AttributeError", other.to_owned())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_objects_stay_in_the_host_across_the_process_boundary() {
    let (sender, mut received) = mpsc::unbounded_channel();
    let outbox = Arc::new(Outbox {
        sender,
        sent: Mutex::new(0),
    });
    let rt = KernelRuntime::new().expect("python");
    rt.register(Resources::new().object(ObjectBinding::new("outbox", outbox.clone())))
        .await
        .expect("registers");
    let out = run(&rt, "[outbox.send(f'hello {i}') for i in range(3)]").await;
    assert_eq!(out.output, "[1, 2, 3]\n");
    assert_eq!(received.recv().await.as_deref(), Some("hello 0"));
    let back: Arc<Outbox> = rt.retrieve_object("outbox").await.expect("still bound");
    assert!(Arc::ptr_eq(&back, &outbox), "the very object, not a copy");
    assert_eq!(*back.sent.lock().expect("not poisoned"), 3);
    // After a crash the proxy is bound again, to the same object.
    run(&rt, "import os\nos._exit(1)").await;
    assert_eq!(run(&rt, "outbox.send('again')").await.output, "4\n");
    run(&rt, "outbox = None").await;
    assert!(matches!(
        rt.retrieve_object::<Outbox>("outbox").await,
        Err(RuntimeError::Unbound { .. })
    ));
}

/// A host function may run a cell in the same runtime while the calling cell waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_work() {
    let runtime: Arc<OnceLock<KernelRuntime>> = Arc::new(OnceLock::new());
    let inner = runtime.clone();
    let sig = Signature::new([Param::new("code").annotated("str")]).returns("str");
    let evaluate = Function::host("evaluate", sig, move |args: Args| {
        let inner = inner.clone();
        async move {
            let code: String = args.get("code")?;
            let rt = inner
                .get()
                .ok_or_else(|| HostError::runtime("no runtime"))?;
            let out = rt
                .execute(&code, &DiscardOutput)
                .await
                .map_err(HostError::runtime)?;
            Ok(Value::Str(out.output))
        }
    });
    let rt = KernelRuntime::new().expect("python");
    rt.register(Resources::new().function(evaluate))
        .await
        .expect("registers");
    let _ = runtime.set(rt.clone());
    let out = run(
        &rt,
        "x = 20\nprint('outer before')\ninner = evaluate('print(\"inner\")\\nx + 1')\nprint('outer after', repr(inner))\nevaluate('evaluate(\"x * 2\")')",
    )
    .await;
    assert_eq!(
        out.output,
        "outer before\nouter after 'inner\\n21\\n'\n\"'40\\\\n'\\n\"\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_ints_go_in_and_come_back() {
    let rt = KernelRuntime::new().expect("python");
    let numbers: Vec<i64> = (0..1_000_000).collect();
    rt.register(
        Resources::new()
            .variable(Variable::from_serialize("numbers", &numbers).expect("serializes")),
    )
    .await
    .expect("registers");
    run(&rt, "numbers.append(sum(numbers))").await;
    let back: Vec<i64> = rt.retrieve_as("numbers").await.expect("retrieves");
    assert_eq!(back.len(), 1_000_001);
    assert_eq!(back[999_999], 999_999);
    assert_eq!(back[1_000_000], 499_999_500_000);
}

/// A value as large as the frame limit allows works; a larger one says which limit it hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_work_up_to_the_frame_limit() {
    let rt = KernelRuntime::with_config(KernelConfig::new().max_frame(128 << 20)).expect("python");
    let blob = vec![7u8; 100_000_000];
    rt.register(Resources::new().variable(Variable::new("blob", Value::Bytes(blob))))
        .await
        .expect("100 MB fits under 128 MiB");
    assert_eq!(
        run(&rt, "len(blob), blob[-1]").await.output,
        "(100000000, 7)\n"
    );
    run(&rt, "made = b'x' * 100_000_000").await;
    let Value::Bytes(made) = rt.get("made").await.expect("comes back") else {
        panic!("bytes expected");
    };
    assert_eq!(made.len(), 100_000_000);
    run(&rt, "huge = b'x' * 200_000_000").await;
    let err = rt.get("huge").await.expect_err("over the limit");
    assert!(
        matches!(
            &err,
            cave_core::RuntimeError::TooLarge { name, limit: 134_217_728, setting: "KernelConfig::max_frame", size, .. }
                if name == "huge" && *size > 200_000_000
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("over the limit of 134217728 bytes (KernelConfig::max_frame raises it)"),
        "{err}"
    );
    let err = rt
        .update("blob", Value::Bytes(vec![0; 200_000_000]))
        .await
        .expect_err("over the limit");
    assert!(err.to_string().contains("frame limit"), "{err}");
    // The runtime goes on.
    assert_eq!(run(&rt, "len(made)").await.output, "100000000\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_files_load_in_the_child_and_again_after_a_crash() {
    let dir = std::env::temp_dir().join(format!("cave-kernel-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tools.py");
    std::fs::write(
        &path,
        "import os\nfrom dataclasses import dataclass\nfrom cave_agent.runtime import Function, Variable, Type\n\n@dataclass\nclass Order:\n    \"\"\"An order.\"\"\"\n    item: str\n    qty: int = 1\n\ndef total(orders: list[Order]) -> int:\n    \"\"\"Sum of quantities.\"\"\"\n    return sum(o.qty for o in orders)\n\ndef where() -> int:\n    return os.getpid()\n\n__exports__ = [Function(total), Function(where), Type(Order), Variable('orders', [Order('a', 2)], 'pending')]\n",
    )
    .expect("writes");
    let rt = KernelRuntime::new().expect("python");
    let names = rt.register_python_file(&path, false).await.expect("loads");
    assert_eq!(names.names(), ["Order", "total", "where", "orders"]);
    assert_eq!(run(&rt, "total(orders + [Order('b')])").await.output, "3\n");
    let pid = rt.pid().await.expect("started");
    assert_eq!(
        run(&rt, "where()").await.output,
        format!("{pid}\n"),
        "it runs in the child"
    );
    let d = rt.describe();
    assert!(
        d.functions.contains("total(orders: list[Order]) -> int"),
        "{}",
        d.functions
    );
    assert!(d.types.contains("Order:\n  doc: An order."), "{}", d.types);
    run(&rt, "import os\nos._exit(9)").await;
    assert_eq!(run(&rt, "total([Order('c', 5)])").await.output, "5\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What Python cannot load is refused by `register`, before or after the process started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhashable_keys_are_refused_at_registration() {
    let bad = Value::Dict(vec![(Value::List(vec![]), Value::None)]);
    for started in [false, true] {
        let rt = KernelRuntime::new().expect("python");
        if started {
            rt.start().await.expect("starts");
        }
        let err = rt
            .register(Resources::new().variable(Variable::new("bad", bad.clone())))
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("cannot hash"), "{err}");
        assert!(!rt.describe().variables.contains("bad"));
        assert_eq!(run(&rt, "'bad' in globals()").await.output, "False\n");
    }
}

/// An object whose methods are its `names`, each returning its own name.
struct Tools {
    names: Vec<&'static str>,
}

#[async_trait::async_trait]
impl HostObject for Tools {
    fn type_name(&self) -> &str {
        "Tools"
    }
    fn methods(&self) -> Vec<Method> {
        self.names
            .iter()
            .map(|name| Method::new(*name, Signature::default().returns("str")))
            .collect()
    }
    async fn call(&self, method: &str, _args: Args) -> Result<Value, HostError> {
        Ok(Value::Str(method.to_owned()))
    }
}

/// The host binds an object anew while a cell runs (an MCP server's tool list changed during a
/// call: the worker serves the binding before the call's answer): the cell did not rebind it, so
/// it is not told it did, and the next cell has the new methods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_the_host_binds_anew_during_a_cell_is_not_the_cells_doing() {
    let runtime: Arc<OnceLock<KernelRuntime>> = Arc::new(OnceLock::new());
    let inner = runtime.clone();
    let grow = Function::host("grow", Signature::default(), move |_args: Args| {
        let inner = inner.clone();
        async move {
            let rt = inner
                .get()
                .ok_or_else(|| HostError::runtime("no runtime"))?;
            let grown = Arc::new(Tools {
                names: vec!["first", "extra"],
            });
            rt.replace(Resources::new().object(ObjectBinding::new("edge", grown)))
                .await
                .map_err(HostError::runtime)?;
            Ok(Value::Str("grown".to_owned()))
        }
    });
    let rt = KernelRuntime::new().expect("python");
    let edge = Arc::new(Tools {
        names: vec!["first"],
    });
    rt.register(
        Resources::new()
            .function(grow)
            .object(ObjectBinding::new("edge", edge)),
    )
    .await
    .expect("registers");
    let _ = runtime.set(rt.clone());
    let out = run(&rt, "print(grow())").await;
    assert_eq!(out.output, "grown\n", "no note: {out:?}");
    let out = run(&rt, "print(edge.extra())").await;
    assert_eq!(out.output, "extra\n");
    // A rebinding by the cell itself is still told.
    let out = run(&rt, "edge = 1").await;
    assert!(out.output.contains("rebound `edge`"), "{out:?}");
}
