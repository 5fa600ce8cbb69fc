//! The `cave` binary embeds libpython (the in-process runtime): link it with an rpath to the
//! interpreter pyo3 was configured with, so it runs without LD_LIBRARY_PATH.
fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
