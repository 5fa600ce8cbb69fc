//! A runtime written outside cave-agent's crates, with the public API alone, as a user would:
//! only the required methods. What every runtime must do alike (the prompt's description,
//! the secrets the agent redacts, retrieving variables and objects) comes from its registry
//! and cannot be left out.

use cave_core::{
    AgentBuilder, Event, Execution, OutputSink, Registry, Resource, Resources, Runtime,
    RuntimeError, RuntimeExt, Value, Variable, async_trait, lock, normalize_name,
};
use cave_testing::{Reply, ScriptedModel};
use std::collections::HashMap;
use std::sync::Mutex;

/// Runs `print(NAME)` by printing the value bound to `NAME`; nothing else.
#[derive(Default)]
struct PrintingRuntime {
    registry: Mutex<Registry>,
    names: Mutex<HashMap<String, Value>>,
}

#[async_trait]
impl Runtime for PrintingRuntime {
    async fn execute(
        &self,
        code: &str,
        output: &dyn OutputSink,
    ) -> Result<Execution, RuntimeError> {
        let name = code
            .trim()
            .strip_prefix("print(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_default();
        let text = match lock(&self.names).get(&normalize_name(name)) {
            Some(Value::Str(s)) => format!("{s}\n"),
            Some(other) => format!("{other:?}\n"),
            None => format!("NameError: {name}\n"),
        };
        output.write(&text);
        Ok(Execution::ok(text))
    }

    async fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
        for entry in lock(&self.registry).claim(batch)? {
            if let Resource::Variable(variable) = entry.resource {
                lock(&self.names).insert(entry.name, variable.value);
            }
        }
        Ok(())
    }

    fn registry(&self) -> &Mutex<Registry> {
        &self.registry
    }

    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
        let key = lock(&self.registry).update_variable(name, value.clone())?;
        lock(&self.names).insert(key, value);
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
        lock(&self.names)
            .get(&normalize_name(name))
            .cloned()
            .ok_or_else(|| RuntimeError::Unbound {
                name: name.to_owned(),
            })
    }

    async fn object_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        Ok(lock(&self.registry).object(name).is_some())
    }

    async fn bind_unique(
        &self,
        prefix: &str,
        value: Value,
        start: u64,
    ) -> Result<String, RuntimeError> {
        let prefix = cave_core::unique_prefix(prefix, start)?;
        let name = format!("{prefix}_{start}");
        lock(&self.registry).record_binding(&name, value.clone());
        lock(&self.names).insert(name.clone(), value);
        Ok(name)
    }

    async fn reset(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

const TOKEN: &str = "tok-7f3a9c1e55";

#[tokio::test]
async fn a_runtime_of_ones_own_redacts_secrets_and_describes_its_variables() {
    let runtime = PrintingRuntime::default();
    runtime
        .register(
            Resources::new()
                .variable(Variable::secret("API_TOKEN", TOKEN))
                .variable(
                    Variable::new("city", Value::from("Lyon"))
                        .with_description("where the user is"),
                ),
        )
        .await
        .unwrap();
    assert!(runtime.describe().variables.contains("city"));
    assert!(!runtime.describe().variables.contains(TOKEN));
    assert_eq!(runtime.retrieve("city").await.unwrap(), Value::from("Lyon"));
    assert!(matches!(
        runtime.retrieve("nowhere").await,
        Err(RuntimeError::UnknownVariable { .. })
    ));

    let model = ScriptedModel::new([
        Reply::text("```python\nprint(API_TOKEN)\n```"),
        Reply::text("Done."),
    ]);
    let mut agent = AgentBuilder::new(model, runtime).build().unwrap();
    let events: Vec<Event> =
        futures_util::StreamExt::collect(agent.stream("Show the token.")).await;
    let shown = format!("{events:?}{:?}", agent.history());
    assert!(shown.contains("[redacted: API_TOKEN]"), "{shown}");
    assert!(
        !shown.contains(TOKEN),
        "the secret reached an event or the history"
    );
}
