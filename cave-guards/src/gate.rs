//! Standing between the model and a host call: one wrapper for host functions and one for
//! host objects, both handing each call to a [`CallGate`] (the approval guard, the audit
//! record), so that every guard treats functions and methods alike.

use async_trait::async_trait;
use cave_core::{
    Args, Function, FunctionBody, HostError, HostFunction, HostObject, Method, ObjectBinding,
    TypeSchema, Value,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The call a gate lets through (or not).
pub(crate) type Proceed<'a> = Box<
    dyn FnOnce(Args) -> Pin<Box<dyn Future<Output = Result<Value, HostError>> + Send + 'a>>
        + Send
        + 'a,
>;

/// Decides how one host call runs: `name` is the function's name or `object.method`.
#[async_trait]
pub(crate) trait CallGate: Send + Sync + 'static {
    async fn pass(&self, name: &str, args: Args, proceed: Proceed<'_>) -> Result<Value, HostError>;
}

/// Which of a host object's methods a guard covers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MethodFilter {
    /// Every method.
    All,
    /// Only these methods (by their Python names).
    Only(Vec<String>),
}

impl MethodFilter {
    /// Only the methods named.
    pub fn only(methods: impl IntoIterator<Item = impl Into<String>>) -> Self {
        MethodFilter::Only(methods.into_iter().map(Into::into).collect())
    }

    fn covers(&self, method: &str) -> bool {
        match self {
            MethodFilter::All => true,
            MethodFilter::Only(names) => names.iter().any(|n| n == method),
        }
    }
}

/// `function` with each call passed through `gate`; a function the runtime runs itself
/// (Python source, a bound Python object) is returned unchanged, since its calls never reach
/// the host.
pub(crate) fn gate_function(function: Function, gate: impl CallGate) -> Function {
    let FunctionBody::Host(inner) = function.body.clone() else {
        return function;
    };
    let gated = GatedFunction {
        name: function.name.clone(),
        inner,
        gate,
    };
    function.with_body(gated)
}

/// `binding` with the calls of the methods `filter` covers passed through `gate`. Retrieving
/// the binding still hands back the original object (see [`HostObject::wrapped`]).
pub(crate) fn gate_object(
    binding: ObjectBinding,
    gate: impl CallGate,
    filter: MethodFilter,
) -> ObjectBinding {
    let mut binding = binding;
    binding.object = Arc::new(GatedObject {
        name: binding.name.clone(),
        inner: binding.object.clone(),
        gate,
        filter,
    });
    binding
}

struct GatedFunction<G> {
    name: String,
    inner: Arc<dyn HostFunction>,
    gate: G,
}

#[async_trait]
impl<G: CallGate> HostFunction for GatedFunction<G> {
    async fn call(&self, args: Args) -> Result<Value, HostError> {
        let inner = self.inner.clone();
        self.gate
            .pass(
                &self.name,
                args,
                Box::new(move |args| Box::pin(async move { inner.call(args).await })),
            )
            .await
    }
}

struct GatedObject<G> {
    name: String,
    inner: Arc<dyn HostObject>,
    gate: G,
    filter: MethodFilter,
}

#[async_trait]
impl<G: CallGate> HostObject for GatedObject<G> {
    fn type_name(&self) -> &str {
        self.inner.type_name()
    }
    fn methods(&self) -> Vec<Method> {
        self.inner.methods()
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        if !self.filter.covers(method) {
            return self.inner.call(method, args).await;
        }
        let inner = self.inner.clone();
        let owned = method.to_owned();
        self.gate
            .pass(
                &format!("{}.{method}", self.name),
                args,
                Box::new(move |args| Box::pin(async move { inner.call(&owned, args).await })),
            )
            .await
    }
    fn doc(&self) -> Option<String> {
        self.inner.doc()
    }
    fn types(&self) -> Vec<TypeSchema> {
        self.inner.types()
    }
    fn wrapped(&self) -> Option<Arc<dyn HostObject>> {
        Some(self.inner.clone())
    }
}
