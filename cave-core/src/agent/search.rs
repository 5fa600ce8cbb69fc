//! `search_tools`, the host function the agent binds when the prompt names objects only.

use crate::{
    Args, Entry, Function, HostError, Param, Registry, Resource, Resources, Runtime, RuntimeError,
    RuntimeExt, Signature, ToolEntry, ToolIndex, Value, lock, prompt,
};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

/// The index last built, and a fingerprint of what it was built from.
type Cached = Mutex<Option<(u64, Arc<ToolIndex>)>>;

/// What `search_tools` searches: the runtime's registry where it has a handle that lives as
/// long as the runtime ([`Runtime::shared_registry`]), else the runtime as the agent holds it.
/// Weak either way: the runtime holds the function, which must not keep the runtime alive.
enum Searched {
    Registry(Weak<Mutex<Registry>>),
    Runtime(Weak<dyn Runtime>),
}

impl Searched {
    fn of(runtime: &Arc<dyn Runtime>) -> Self {
        match runtime.shared_registry() {
            Some(registry) => Self::Registry(Arc::downgrade(&registry)),
            None => Self::Runtime(Arc::downgrade(runtime)),
        }
    }

    /// What is registered now; `None` once the runtime is gone.
    fn entries(&self) -> Option<Vec<ToolEntry>> {
        match self {
            Self::Registry(registry) => registry.upgrade().map(|r| lock(&r).tool_entries()),
            Self::Runtime(runtime) => runtime.upgrade().map(|r| lock(r.registry()).tool_entries()),
        }
    }
}

/// Returns true if and only if `entry` is a `search_tools` an agent bound.
fn is_ours(entry: &Entry) -> bool {
    matches!(&entry.resource, Resource::Function(f)
        if f.hidden && f.doc.as_deref() == Some(prompt::SEARCH_TOOLS_DOC))
}

/// Binds `search_tools` in `runtime`, unless a resource of that name is the host's own. One an
/// agent bound before is bound again, for this runtime: a fork's registry holds its parent's
/// (which would search the parent), and one bound through another agent's handle of the
/// runtime may have gone with that agent.
pub(crate) async fn register(runtime: &Arc<dyn Runtime>) -> Result<(), RuntimeError> {
    let again = match lock(runtime.registry()).entry(crate::SEARCH_TOOLS) {
        None => false,
        Some(entry) if is_ours(entry) => true,
        Some(_) => return Ok(()),
    };
    let searched = Searched::of(runtime);
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
    let batch = Resources::new().function(search);
    if again {
        runtime.replace(batch).await
    } else {
        runtime.register(batch).await
    }
}

fn answer(searched: &Searched, cache: &Cached, args: &Args) -> Result<Value, HostError> {
    let query: String = args.get("query")?;
    let limit: i64 = args.get("limit")?;
    if limit < 1 {
        return Err(HostError::new(
            "ValueError",
            format!("limit must be at least 1, not {limit}"),
        ));
    }
    let Some(entries) = searched.entries() else {
        return Err(HostError::runtime("the runtime is gone"));
    };
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
