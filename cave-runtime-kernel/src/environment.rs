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

/// The host's pip settings a child with an egress allowlist follows (its index, credentials
/// included, and the certificates it trusts): the same index the host's `pip` uses.
const PIP_FOLLOWED: &[&str] = &[
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "PIP_CONFIG_FILE",
    "PIP_DEFAULT_TIMEOUT",
];

/// The host's pip variables, when set (see [`PIP_FOLLOWED`]).
pub(crate) fn pip_variables() -> Vec<(OsString, OsString)> {
    PIP_FOLLOWED
        .iter()
        .filter_map(|&name| Some((OsString::from(name), std::env::var_os(name)?)))
        .collect()
}

/// The files pip reads its configuration from (global, user, `PIP_CONFIG_FILE`) and the
/// certificates its settings name, where they exist: what a sandboxed pip must be able to read
/// to use the host's index.
pub(crate) fn pip_readable() -> Vec<std::path::PathBuf> {
    use std::path::PathBuf;
    let mut paths: Vec<PathBuf> = vec!["/etc/pip.conf".into()];
    let xdg_dirs = std::env::var_os("XDG_CONFIG_DIRS").unwrap_or_else(|| "/etc/xdg".into());
    paths.extend(std::env::split_paths(&xdg_dirs).map(|d| d.join("pip/pip.conf")));
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        let config = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".config"));
        paths.push(config.join("pip/pip.conf"));
        paths.push(home.join(".pip/pip.conf"));
    }
    for name in ["PIP_CONFIG_FILE", "PIP_CERT"] {
        paths.extend(std::env::var_os(name).map(PathBuf::from));
    }
    paths.retain(|p| p.exists());
    paths
}
