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
//! - `set name 'value'`: binds a name

use cave_core::{
    Description, Execution, ExecutionError, Interrupt, Interruption, NameError, NameKind,
    NameProblem, OutputSink, Resource, Resources, Runtime, RuntimeError, Value, validate_name,
};
use std::collections::BTreeMap;
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

#[derive(Default)]
pub struct FakeRuntime {
    pub executed: Mutex<Vec<String>>,
    pub namespace: Mutex<BTreeMap<String, Value>>,
    pub variables: Mutex<Vec<String>>,
    pub last_index: Mutex<BTreeMap<String, u64>>,
    pub interrupt: Option<Arc<FakeInterrupt>>,
    pub fail_bind: bool,
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

    pub fn value(&self, name: &str) -> Option<Value> {
        self.namespace.lock().unwrap().get(name).cloned()
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
            } else if let Some(rest) = line.strip_prefix("set ") {
                let (name, value) = rest.split_once(' ').unwrap();
                self.namespace
                    .lock()
                    .unwrap()
                    .insert(name.to_owned(), Value::Str(quoted(value).to_owned()));
            }
        }
        Ok(Execution::ok(out).with_state_lost(state_lost))
    }

    fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
        let mut ns = self.namespace.lock().unwrap();
        let mut staged = Vec::new();
        for item in batch.items() {
            let name = validate_name(item.kind(), item.name())?;
            if ns.contains_key(&name) || staged.iter().any(|(n, _)| n == &name) {
                let problem = NameProblem::Exists;
                return Err(NameError {
                    kind: item.kind(),
                    name: item.name().into(),
                    problem,
                }
                .into());
            }
            let value = match item {
                Resource::Variable(v) => v.value.clone(),
                Resource::Binding { value, .. } => value.clone(),
                _ => Value::None,
            };
            staged.push((name, value));
        }
        for (name, value) in staged {
            self.variables.lock().unwrap().push(name.clone());
            ns.insert(name, value);
        }
        Ok(())
    }

    fn describe(&self) -> Description {
        let vars = self.variables.lock().unwrap();
        let variables = if vars.is_empty() {
            "No variables available".to_owned()
        } else {
            vars.iter()
                .map(|v| format!("- name: {v}"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        Description::new("No functions available", variables, "No types available")
    }

    async fn retrieve(&self, name: &str) -> Result<Value, RuntimeError> {
        let vars = self.variables.lock().unwrap().clone();
        if !vars.iter().any(|v| v == name) {
            return Err(RuntimeError::UnknownVariable {
                name: name.into(),
                available: vars,
            });
        }
        self.get(name).await
    }

    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
        self.retrieve(name).await?;
        self.namespace.lock().unwrap().insert(name.into(), value);
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
        self.value(name)
            .ok_or_else(|| RuntimeError::Unbound { name: name.into() })
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
        if start == 0 {
            return Err(RuntimeError::InvalidStart);
        }
        let prefix = validate_name(NameKind::Prefix, &format!("{prefix}_{start}"))?
            .rsplit_once('_')
            .map(|(p, _)| p.to_owned())
            .unwrap();
        let mut last = self.last_index.lock().unwrap();
        let mut ns = self.namespace.lock().unwrap();
        let mut index = start.max(last.get(&prefix).map_or(0, |l| l + 1));
        while ns.contains_key(&format!("{prefix}_{index}")) {
            index += 1;
        }
        let name = format!("{prefix}_{index}");
        ns.insert(name.clone(), value);
        last.insert(prefix, index);
        Ok(name)
    }

    async fn reset(&self) -> Result<(), RuntimeError> {
        let vars = self.variables.lock().unwrap().clone();
        self.namespace
            .lock()
            .unwrap()
            .retain(|k, _| vars.contains(k));
        Ok(())
    }

    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        self.interrupt.clone().map(|i| i as Arc<dyn Interrupt>)
    }
}
