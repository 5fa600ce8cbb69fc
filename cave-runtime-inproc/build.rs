//! Binaries built here (tests, benches, examples) load the libpython pyo3 was configured
//! with, found through an rpath rather than the system's library path: without it, a machine
//! with two Python 3.11 installs loads the wrong one. Crates that build binaries embedding
//! this runtime call the same function from their own build script.
fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
