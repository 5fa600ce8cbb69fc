//! The one way the crates lock a `std::sync::Mutex`.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking the data as it is when a thread panicked while holding it: every
/// guarded value here stays consistent at each statement (a panic leaves nothing half-written
/// that a later reader must not see), and a poisoned lock must not turn one panic into many.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
