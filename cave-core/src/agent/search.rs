//! `search_tools`, the host function the agent binds when the prompt names objects only.

use crate::{
    Args, Function, HostError, Param, Resources, Runtime, RuntimeError, Signature, ToolIndex,
    Value, lock, prompt,
};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

/// The index last built, and a fingerprint of what it was built from.
type Cached = Mutex<Option<(u64, Arc<ToolIndex>)>>;

/// Binds `search_tools` in `runtime`, unless a resource of that name is there already (the
/// host's own).
pub(crate) async fn register(runtime: &Arc<dyn Runtime>) -> Result<(), RuntimeError> {
    if lock(runtime.registry())
        .entry(crate::SEARCH_TOOLS)
        .is_some()
    {
        return Ok(());
    }
    // Weak: the runtime holds the function, which must not keep the runtime alive.
    let searched: Weak<dyn Runtime> = Arc::downgrade(runtime);
    let cache: Arc<Cached> = Arc::new(Mutex::new(None));
    let signature = Signature::new([
        Param::new("query").annotated("str"),
        Param::new("limit")
            .annotated("int")
            .default_value(Value::Int(5)),
    ])
    .returns("str");
    let search = Function::host(crate::SEARCH_TOOLS, signature, move |args: Args| {
        let found = answer(&searched, &cache, &args);
        async move { found }
    })
    .with_doc(prompt::SEARCH_TOOLS_DOC)
    .hidden();
    runtime.register(Resources::new().function(search)).await
}

fn answer(runtime: &Weak<dyn Runtime>, cache: &Cached, args: &Args) -> Result<Value, HostError> {
    let query: String = args.get("query")?;
    let limit: i64 = args.get("limit")?;
    if limit < 1 {
        return Err(HostError::new(
            "ValueError",
            format!("limit must be at least 1, not {limit}"),
        ));
    }
    let Some(runtime) = runtime.upgrade() else {
        return Err(HostError::runtime("the runtime is gone"));
    };
    let entries = lock(runtime.registry()).tool_entries();
    // Built again only when what it holds changed (a server's tool list, a new object).
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for entry in &entries {
        entry.path.hash(&mut hasher);
        entry.signature.to_string().hash(&mut hasher);
        entry.doc.hash(&mut hasher);
    }
    let fingerprint = hasher.finish();
    let index = {
        let mut cached = lock(cache);
        match cached.as_ref() {
            Some((held, index)) if *held == fingerprint => index.clone(),
            _ => {
                let index = Arc::new(ToolIndex::new(entries));
                *cached = Some((fingerprint, index.clone()));
                index
            }
        }
    };
    Ok(Value::Str(index.answer(&query, limit as usize)))
}
