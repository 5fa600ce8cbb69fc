//! What the runtime prepares in the interpreter its runtimes share, before any cell runs.
//!
//! A binary of its own: its interpreter is started here without `site`, which on some machines
//! imports `typing` through a `.pth` file and would hide what the runtime itself does.

use cave_core::{DiscardOutput, Runtime};
use cave_runtime_inproc::InProcRuntime;
use cave_runtime_inproc::pyo3::ffi;

/// The standard library reads `typing` from `sys.modules` without the import lock (a dataclass
/// with postponed annotations), so a first import of it by one runtime's cell showed the
/// others a half-initialised module (a CI failure: "partially initialized module 'typing' has
/// no attribute 'ClassVar'"). The runtime imports it before any cell runs.
#[tokio::test]
async fn typing_is_imported_before_the_first_cell() {
    start_without_site();
    let rt = InProcRuntime::new().unwrap();
    let seen = rt
        .execute(
            "import sys\nm = sys.modules.get('typing')\n\
             print(m is not None and not getattr(m.__spec__, '_initializing', False))\n\
             print(sys.flags.no_site)",
            &DiscardOutput,
        )
        .await
        .unwrap();
    assert_eq!(seen.output, "True\n1\n", "{seen:?}");
}

fn start_without_site() {
    // SAFETY: called once, before anything in this process touched the interpreter; the
    // thread state is released at the end as `Python::initialize` would leave it.
    unsafe {
        assert_eq!(ffi::Py_IsInitialized(), 0);
        let mut config = std::mem::MaybeUninit::<ffi::PyConfig>::uninit();
        ffi::PyConfig_InitPythonConfig(config.as_mut_ptr());
        let mut config = config.assume_init();
        config.site_import = 0;
        let status = ffi::Py_InitializeFromConfig(&config);
        ffi::PyConfig_Clear(&mut config);
        assert_eq!(
            ffi::PyStatus_Exception(status),
            0,
            "the interpreter did not start"
        );
        ffi::PyEval_SaveThread();
    }
}
