//! A small in-test runtime: a few commands instead of Python, with a real namespace for
//! `bind_unique` and a real interrupt, so the agent loop can be tested without an interpreter.
//!
//! Commands, one per line:
//! - `print('text')`: prints `text\n`
//! - `raise Kind('msg')`: prints a traceback and fails with `Kind: msg`
//! - `raise_silent Kind('msg')`: fails with no output
//! - `big(N)`: prints N `x`s
//! - `stream(a,b,c)`: writes `a`, `b`, `c` live, one at a time
//! - `spin()`: runs until interrupted
//! - `block()`: runs forever, deaf to interrupts (a blocking C call)
//! - `crash()`: the runtime itself fails
//! - `panic()`: the runtime panics (a defect)
//! - `lose_state()`: succeeds, reporting that state was lost

use cave_core::{
    Execution, ExecutionError, Interrupt, Interruption, OutputSink, Resources, Runtime,
    RuntimeError, Value,
};
use cave_testing::EchoRuntime;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// What the fake interrupt reports, and whether it can stop `spin()`.
#[derive(Debug)]
pub struct FakeInterrupt {
    pub outcome: Interruption,
    pub calls: AtomicUsize,
    stop: Notify,
}

impl Interrupt for FakeInterrupt {
    fn interrupt(&self) -> Interruption {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.stop.notify_waiters();
        self.stop.notify_one();
        self.outcome
    }
}

/// The commands above; names and values live in an [`EchoRuntime`].
#[derive(Default)]
pub struct FakeRuntime {
    pub executed: Mutex<Vec<String>>,
    pub namespace: EchoRuntime,
    pub interrupt: Option<Arc<FakeInterrupt>>,
    pub fail_bind: bool,
    /// `bind_unique_spooled` fails (a whole output too large to send to the runtime).
    pub fail_bind_spooled: bool,
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// A runtime whose interrupt reports `outcome`.
    pub fn interruptible(outcome: Interruption) -> Self {
        Self {
            interrupt: Some(Arc::new(FakeInterrupt {
                outcome,
                calls: AtomicUsize::new(0),
                stop: Notify::new(),
            })),
            ..Self::default()
        }
    }

    pub fn executed(&self) -> Vec<String> {
        self.executed.lock().unwrap().clone()
    }

    pub fn interrupts(&self) -> usize {
        self.interrupt
            .as_ref()
            .map_or(0, |i| i.calls.load(Ordering::SeqCst))
    }

    /// Binds a name as the model's code would.
    pub async fn bind(&self, name: &str, value: Value) {
        self.namespace
            .register(Resources::new().binding(name, value))
            .await
            .unwrap();
    }

    pub async fn value(&self, name: &str) -> Option<Value> {
        self.namespace.get(name).await.ok()
    }
}

fn quoted(s: &str) -> &str {
    s.trim().trim_start_matches('\'').trim_end_matches('\'')
}

#[async_trait::async_trait]
impl Runtime for FakeRuntime {
    async fn execute(
        &self,
        code: &str,
        output: &dyn OutputSink,
    ) -> Result<Execution, RuntimeError> {
        self.executed.lock().unwrap().push(code.to_owned());
        let mut out = String::new();
        let mut state_lost = false;
        let mut connections = cave_core::Connections::default();
        for line in code.lines().map(str::trim) {
            if let Some(text) = line
                .strip_prefix("print(")
                .and_then(|r| r.strip_suffix(')'))
            {
                out.push_str(quoted(text));
                out.push('\n');
            } else if let Some(rest) = line.strip_prefix("raise_silent ") {
                let (kind, msg) = rest.split_once('(').unwrap();
                return Ok(Execution::failed(
                    "",
                    ExecutionError::new(kind, quoted(msg.trim_end_matches(')'))),
                ));
            } else if let Some(rest) = line.strip_prefix("raise ") {
                let (kind, msg) = rest.split_once('(').unwrap();
                let msg = quoted(msg.trim_end_matches(')'));
                out.push_str(&format!(
                    "Traceback (most recent call last):\n  File \"<cell>\", line 1\n{kind}: {msg}\n"
                ));
                return Ok(Execution::failed(out, ExecutionError::new(kind, msg)));
            } else if let Some(n) = line.strip_prefix("big(").and_then(|r| r.strip_suffix(')')) {
                out.push_str(&"x".repeat(n.parse().unwrap()));
            } else if let Some(parts) = line
                .strip_prefix("stream(")
                .and_then(|r| r.strip_suffix(')'))
            {
                for part in parts.split(',') {
                    output.write(part);
                    out.push_str(part);
                    tokio::task::yield_now().await;
                }
            } else if line == "spin()" {
                match &self.interrupt {
                    Some(i) => i.stop.notified().await,
                    None => std::future::pending().await,
                }
                return Ok(Execution::failed(
                    out,
                    ExecutionError::new("KeyboardInterrupt", ""),
                ));
            } else if line == "block()" {
                std::future::pending::<()>().await;
            } else if line == "crash()" {
                return Err(RuntimeError::Backend {
                    operation: "execute",
                    message: "the worker died".into(),
                });
            } else if line == "panic()" {
                panic!("fake runtime defect");
            } else if line == "lose_state()" {
                state_lost = true;
            } else if line == "connect()" {
                // As a runtime with an egress proxy tells them: one let through, one refused,
                // and three past what the cell's account lists.
                let mut reached = cave_core::Connection::new("example.org", 443, true);
                reached.sent = 517;
                reached.received = 4096;
                let refused = cave_core::Connection::new("evil.test", 443, false);
                connections = cave_core::Connections::new(vec![reached, refused], 3);
            }
        }
        Ok(Execution::ok(out)
            .with_state_lost(state_lost)
            .with_connections(connections))
    }

    async fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
        self.namespace.register(batch).await
    }

    fn registry(&self) -> &std::sync::Mutex<cave_core::Registry> {
        self.namespace.registry()
    }

    async fn object_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        self.namespace.object_bound(name).await
    }

    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
        self.namespace.update(name, value).await
    }

    async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
        self.namespace.get(name).await
    }

    async fn bind_unique(
        &self,
        prefix: &str,
        value: Value,
        start: u64,
    ) -> Result<String, RuntimeError> {
        if self.fail_bind {
            return Err(RuntimeError::Backend {
                operation: "bind_unique",
                message: "no memory left".into(),
            });
        }
        self.namespace.bind_unique(prefix, value, start).await
    }

    async fn bind_unique_spooled(
        &self,
        prefix: &str,
        spooled: &cave_core::SpooledOutput,
        start: u64,
    ) -> Result<String, RuntimeError> {
        if self.fail_bind_spooled {
            return Err(RuntimeError::Backend {
                operation: "bind_unique_spooled",
                message: "larger than a frame".into(),
            });
        }
        let text = spooled.text()?;
        self.bind_unique(prefix, Value::Str(text), start).await
    }

    async fn reset(&self) -> Result<(), RuntimeError> {
        self.namespace.reset().await
    }

    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        self.interrupt.clone().map(|i| i as Arc<dyn Interrupt>)
    }
}
