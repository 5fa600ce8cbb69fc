//! With the in-process runtime, this crate's binaries (tests, examples) embed libpython: link
//! them with an rpath to the interpreter pyo3 was configured with (see cave-runtime-inproc).
fn main() {
    if std::env::var_os("CARGO_FEATURE_INPROC").is_some() {
        pyo3_build_config::add_libpython_rpath_link_args();
    }
}
