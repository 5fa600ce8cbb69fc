//! A `tracing` subscriber that keeps every span with its parent and fields, for tests of the
//! spans a run makes (the tree, the attributes, what must never be recorded).
//!
//! ```
//! use cave_testing::spans::SpanCapture;
//!
//! let capture = SpanCapture::new();
//! tracing::subscriber::with_default(capture.clone(), || {
//!     let outer = tracing::info_span!("outer", answer = 42);
//!     outer.in_scope(|| {
//!         let _inner = tracing::info_span!("inner");
//!     });
//! });
//! let spans = capture.spans();
//! assert_eq!(spans[0].name, "outer");
//! assert_eq!(spans[0].fields["answer"], "42");
//! assert_eq!(spans[1].parent, Some(spans[0].id));
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_core::span::Current;

/// A span as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedSpan {
    /// Its id (in creation order, from 1).
    pub id: u64,
    /// Its name (the callsite's: `invoke_agent`, `chat`, ...).
    pub name: &'static str,
    /// Its parent's id, explicit or contextual.
    pub parent: Option<u64>,
    /// Its fields as recorded (numbers and booleans in their `Debug` form).
    pub fields: BTreeMap<String, String>,
}

/// Keeps every span; clone it to install it and read it later.
#[derive(Clone, Debug, Default)]
pub struct SpanCapture {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: AtomicU64,
    spans: Mutex<BTreeMap<u64, CapturedSpan>>,
    /// Each span's callsite, for `Span::current()`.
    metadata: Mutex<BTreeMap<u64, &'static Metadata<'static>>>,
}

thread_local! {
    /// The spans entered on this thread, innermost last.
    static ENTERED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

impl SpanCapture {
    /// An empty capture.
    pub fn new() -> Self {
        Self::default()
    }

    /// The spans so far, in creation order.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        cave_core::lock(&self.inner.spans)
            .values()
            .cloned()
            .collect()
    }

    /// The spans whose parent is `parent`, in creation order.
    pub fn children(&self, parent: u64) -> Vec<CapturedSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.parent == Some(parent))
            .collect()
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for SpanCapture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.inner.next.fetch_add(1, Ordering::SeqCst) + 1;
        let parent = match attrs.parent() {
            Some(parent) => Some(parent.into_u64()),
            None if attrs.is_contextual() => ENTERED.with(|e| e.borrow().last().copied()),
            None => None,
        };
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        cave_core::lock(&self.inner.metadata).insert(id, attrs.metadata());
        cave_core::lock(&self.inner.spans).insert(
            id,
            CapturedSpan {
                id,
                name: attrs.metadata().name(),
                parent,
                fields,
            },
        );
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(captured) = cave_core::lock(&self.inner.spans).get_mut(&span.into_u64()) {
            values.record(&mut Fields(&mut captured.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, span: &Id) {
        ENTERED.with(|e| e.borrow_mut().push(span.into_u64()));
    }
    fn exit(&self, span: &Id) {
        ENTERED.with(|e| {
            let mut entered = e.borrow_mut();
            if let Some(at) = entered.iter().rposition(|s| *s == span.into_u64()) {
                entered.remove(at);
            }
        });
    }
    fn current_span(&self) -> Current {
        let entered = ENTERED.with(|e| e.borrow().last().copied());
        let metadata = entered.and_then(|id| {
            cave_core::lock(&self.inner.metadata)
                .get(&id)
                .map(|m| (id, *m))
        });
        match metadata {
            Some((id, metadata)) => Current::new(Id::from_u64(id), metadata),
            None => Current::none(),
        }
    }
}
