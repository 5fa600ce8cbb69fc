//! How a test meets a machine that lacks what it needs: it says so and skips, except in the
//! project's own CI (`CI` set), whose machine must have everything, where it fails.

/// Whether `test` skips for want of something this machine lacks (`lacking`: why it lacks it,
/// `None` when it does not). A skip is said on stderr (`skipped: TEST: WHY`); under `CI` the
/// test fails instead.
///
/// ```
/// assert!(!cave_testing::machine::skips("a test", None));
/// ```
pub fn skips(test: &str, lacking: Option<String>) -> bool {
    let Some(why) = lacking else {
        return false;
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: this machine lacks {why} (the project's CI must run every test)"
    );
    eprintln!("skipped: {test}: this machine lacks {why}");
    true
}
