//! The child's environment: an allow-list of the host's variables, never its secrets.

use std::ffi::OsString;

/// Variables the child inherits from the host, when set: enough for Python, locales and
/// virtualenvs. Everything else (API keys first) stays in the host.
const INHERITED: &[&str] = &["PATH", "HOME", "LANG", "TZ", "VIRTUAL_ENV", "PYTHONPATH"];

/// The host variables the child starts with.
pub(crate) fn inherited() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(name, _)| {
            name.to_str()
                .is_some_and(|name| INHERITED.contains(&name) || name.starts_with("LC_"))
        })
        .collect()
}
