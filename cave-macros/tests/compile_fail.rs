//! Signatures the model cannot call are refused at compile time, each with a message that
//! says what to write instead (`tests/ui/*.stderr`; `TRYBUILD=overwrite` rewrites them).

#[test]
fn unsupported_signatures_are_refused_with_a_way_out() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
